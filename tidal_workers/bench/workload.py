"""What the harvest benchmark sends: request lengths drawn from stated distributions, in tokens of the served
model, and prompts that never share a prefix.

Lengths are log-normal (median, spread) clipped to a range, the shape request-length traces of chat services
have (a body of typical requests, a tail of long ones). Every prompt starts with its own random words, so no
two share even their first cache block: a repeated prompt would be served from vLLM's prefix cache and an
online prefill would cost nothing.
"""

from __future__ import annotations

import dataclasses
import math
import random
import typing as t


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A length in tokens: log-normal around ``median`` (``sigma`` of its log), clipped to [low, high]."""

    median: int
    low: int
    high: int
    sigma: float = 0.6

    def draw(self, rng: random.Random) -> int:
        return min(self.high, max(self.low, round(rng.lognormvariate(math.log(self.median), self.sigma))))

    def mean(self, draws: int = 4000) -> float:
        """The clipped distribution's mean (by sampling: sizes the batch backlog, nothing finer)."""
        rng = random.Random(1)
        return sum(self.draw(rng) for _ in range(draws)) / draws


@dataclasses.dataclass(frozen=True)
class Workload:
    online_prompt: Lengths
    online_output: Lengths
    batch_prompt: Lengths
    batch_output: Lengths


# Chat-like online traffic (prompts of a few hundred tokens, answers up to a few hundred) beside batch work
# with longer prompts and longer outputs (summaries, extraction). The seed's testbed served this on an A6000.
GPU_WORKLOAD = Workload(
    online_prompt=Lengths(median=256, low=32, high=1024),
    online_output=Lengths(median=128, low=16, high=384),
    batch_prompt=Lengths(median=768, low=128, high=2048),
    batch_output=Lengths(median=384, low=64, high=1024),
)


@dataclasses.dataclass(frozen=True)
class BatchMix:
    """A batch workload of the frontier (issue 35 item 6): its lengths, and where they come from."""

    name: str
    prompt: Lengths
    output: Lengths
    source: str

    def workload(self, base: Workload = GPU_WORKLOAD) -> Workload:
        """``base``'s online lengths beside this batch."""
        return dataclasses.replace(base, batch_prompt=self.prompt, batch_output=self.output)


BATCH_MIXES = {
    mix.name: mix
    for mix in (
        BatchMix(
            "standard",
            GPU_WORKLOAD.batch_prompt,
            GPU_WORKLOAD.batch_output,
            "the harvest benchmark's batch since the seed: summaries and extraction, prompts ~900 and outputs ~440 "
            "tokens on average",
        ),
        BatchMix(
            "decode-heavy",
            Lengths(median=160, low=32, high=512, sigma=0.5),
            Lengths(median=768, low=256, high=2048, sigma=0.5),
            "assumed, shaped like a synthetic-data generation run: a short instruction, a long answer; prompts ~200 "
            "and outputs ~860 tokens on average",
        ),
        BatchMix(
            "long-prompt",
            Lengths(median=2400, low=1024, high=4096, sigma=0.3),
            Lengths(median=280, low=96, high=640, sigma=0.4),
            "issue 35's long-prompt summarization: a document of ~2,500 tokens summarized in ~300",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class OnlineLoad:
    """An online load of the frontier: today's chat lengths (``GPU_WORKLOAD``) at a flat or a diurnal rate, or a
    step from one rate to another (issue 36's instant)."""

    name: str
    rate: float  # requests/s; the diurnal trace's mean; a step's rate after it
    trace: str  # "flat", "diurnal" or "step"
    amplitude: float = 0.0  # the diurnal swing as a fraction of the mean
    step_from: float = 0.0  # a step's rate before it


ONLINE_LOADS = {
    load.name: load
    for load in (
        OnlineLoad("flat-8", 8.0, "flat"),
        OnlineLoad("flat-5", 5.0, "flat"),
        OnlineLoad("diurnal-5", 5.0, "diurnal", 0.8),
        OnlineLoad("step-1-8", 8.0, "step", step_from=1.0),
    )
}

# The same shapes scaled to what a 2-core CPU engine answers in a phase (the CPU-engine history's sizes).
CPU_WORKLOAD = Workload(
    online_prompt=Lengths(median=120, low=32, high=256),
    online_output=Lengths(median=48, low=16, high=96),
    batch_prompt=Lengths(median=420, low=128, high=1024),
    batch_output=Lengths(median=128, low=32, high=256),
)


class Tokenizer(t.Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def load_tokenizer(model_dir: str) -> Tokenizer:
    """The served model's own tokenizer (from its directory), so lengths are in the tokens the engine counts."""
    from transformers import AutoTokenizer

    return t.cast(Tokenizer, AutoTokenizer.from_pretrained(model_dir))


SYLLABLES = ("ta", "ri", "so", "ne", "lu", "ka", "mo", "vi", "de", "po", "sha", "ren", "tal", "mir", "que", "zo")


class Prompts:
    """Distinct prompts of a given number of tokens, reproducible from ``seed``."""

    def __init__(self, tokenizer: Tokenizer, seed: int):
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)

    def _word(self) -> str:
        return "".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(1, 3)))

    def make(self, tokens: int) -> str:
        """Random words cut to ``tokens`` tokens of the tokenizer (a BPE cut may re-encode a token or two off)."""
        words = max(tokens, 8)
        while True:
            ids = self.tokenizer.encode(" ".join(self._word() for _ in range(words)), add_special_tokens=False)
            if len(ids) >= tokens:
                return self.tokenizer.decode(ids[:tokens])
            words *= 2


@dataclasses.dataclass(frozen=True)
class Request:
    """One request to send: when (online: seconds after the phase opens), what, and how many tokens back."""

    at: float
    prompt: str
    max_tokens: int


def online_requests(
    times: t.Sequence[float], workload: Workload, prompts: Prompts, rng: random.Random
) -> list[Request]:
    return [
        Request(at, prompts.make(workload.online_prompt.draw(rng)), workload.online_output.draw(rng)) for at in times
    ]


def batch_requests(count: int, workload: Workload, prompts: Prompts, rng: random.Random) -> t.Iterator[Request]:
    for _ in range(count):
        yield Request(0.0, prompts.make(workload.batch_prompt.draw(rng)), workload.batch_output.draw(rng))


def chat_body(model: str, request: Request, priority: int | None = None) -> dict:
    """A non-streaming chat request generating exactly ``max_tokens`` (EOS ignored: lengths stay as drawn)."""
    body: dict = {
        "model": model,
        "max_tokens": request.max_tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": request.prompt}],
    }
    if priority is not None:
        body["priority"] = priority
    return body
