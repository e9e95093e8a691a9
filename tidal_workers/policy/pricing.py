"""What a batch costs, and what it saved against the online price.

Prices are online USD per 1M tokens, input and output, per model, with ``*``
as the default (``settings.price_table``); batch work is billed at
``settings.batch_discount`` times that. Cached input tokens are part of the
input and reasoning tokens part of the output, as in OpenAI's usage objects;
the table has no separate cached rate, so they bill at the full rate.
"""

from __future__ import annotations

import dataclasses
import typing as t

PER_TOKENS = 1_000_000
PriceTable = t.Mapping[str, tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0  # of input_tokens
    output_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(self.columns().values(), other.columns().values())))

    def columns(self) -> dict[str, int]:
        """The fields by name, which are also the items' and batches' token columns. Not ``dataclasses.asdict``:
        its deep copy cost the result write more than SQLite spent running it."""
        return {
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }

    @classmethod
    def from_response(cls, usage: t.Mapping[str, t.Any] | None) -> Usage:
        """Read an engine response's ``usage``, in either OpenAI vocabulary.

        Chat and completions say prompt/completion tokens; the Responses API
        says input/output. Details vLLM leaves null count as 0.
        """
        if not usage:
            return cls()
        in_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        out_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
        return cls(
            input_tokens=int(usage.get("prompt_tokens", usage.get("input_tokens")) or 0),
            cached_tokens=int(in_details.get("cached_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens", usage.get("output_tokens")) or 0),
            reasoning_tokens=int(out_details.get("reasoning_tokens") or 0),
        )

    def as_batch_usage(self) -> dict[str, t.Any]:
        """The ``usage`` object of an OpenAI batch."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.total_tokens,
        }


@dataclasses.dataclass(frozen=True)
class Cost:
    online_usd: float = 0.0  # what the same tokens cost online
    batch_usd: float = 0.0  # what the batch is billed
    saved_usd: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.online_usd + other.online_usd, self.batch_usd + other.batch_usd, self.saved_usd + other.saved_usd
        )


def prices_for(model: str, table: PriceTable) -> tuple[float, float]:
    """(input, output) online USD per 1M tokens for ``model``, else the ``*`` row."""
    try:
        return table[model] if model in table else table["*"]
    except KeyError:
        raise ValueError(f"no price for model {model!r} and no '*' default in TIDAL_PRICES") from None


def cost(usage: Usage, model: str, table: PriceTable, discount: float = 0.5) -> Cost:
    per_input, per_output = prices_for(model, table)
    online = (usage.input_tokens * per_input + usage.output_tokens * per_output) / PER_TOKENS
    batch = online * discount
    return Cost(online_usd=online, batch_usd=batch, saved_usd=online - batch)
