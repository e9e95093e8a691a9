"""This node's requests that the engine finished, counted so that the latency gate can tell the online load from its
own: vLLM counts every request it finishes alike (``policy/profile_reference.py``), so the online load is the
engine's count less this one.

Counted where an answer comes back: an item's POST (its ``usage``) and each staged warm-up (its prompt, one token);
and, for the online arrivals (vLLM's time-to-first-token histogram counts every request's first token), each
request as it is sent: its first token follows within a step or so at the gate's working set. Counts only grow,
like a Prometheus counter; the gate reads the difference between two readings.
"""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class Finished:
    """Totals since the process started."""

    requests: int = 0  # items and warm-ups: every request the engine finished for this node
    prompt_tokens: int = 0  # their whole prompts, cached parts included (as vLLM's histogram counts them)
    output_tokens: int = 0
    computed_tokens: int = 0  # prompt tokens the engine computed for them: not what a warm-up had already cached
    items: int = 0  # items alone (no warm-ups): their prompts and outputs size the batch's KV
    item_prompt_tokens: int = 0
    item_output_tokens: int = 0
    sent: int = 0  # requests sent, items and warm-ups: the engine counts each one's first token


class OwnRequests:
    """Thread-safe totals: the pool's threads add, the gate's thread reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = Finished()

    def sent(self) -> None:
        """A request is being sent to the engine."""
        self._add(Finished(sent=1))

    def warm_up(self, prompt_tokens: int, computed_tokens: int) -> None:
        """A staged warm-up answered: its prompt (``computed_tokens`` of it new), one token generated."""
        self._add(Finished(1, prompt_tokens, 1, computed_tokens))

    def item(self, prompt_tokens: int, output_tokens: int, warmed_tokens: int) -> None:
        """An item's request answered, ``warmed_tokens`` of its prompt warmed by staging before it."""
        computed = max(0, prompt_tokens - warmed_tokens)
        self._add(Finished(1, prompt_tokens, output_tokens, computed, 1, prompt_tokens, output_tokens))

    def totals(self) -> Finished:
        with self._lock:
            return self._totals

    def _add(self, more: Finished) -> None:
        with self._lock:
            now = self._totals
            self._totals = Finished(*(a + b for a, b in zip(dataclasses.astuple(now), dataclasses.astuple(more))))


OWN = OwnRequests()  # the process's: one worker process per engine node (the threads pool)
