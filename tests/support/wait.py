"""The tests' one polling loop: a test waits for an event (a state it can read), never for a length of time."""

from __future__ import annotations

import time
import typing as t

T = t.TypeVar("T")


def wait_for(
    predicate: t.Callable[[], T],
    timeout: float = 30.0,
    what: str | t.Callable[[], str] = "condition",
    every: float = 0.05,
) -> T:
    """Call ``predicate`` every ``every`` seconds until it returns something true, and return that.

    Past ``timeout`` seconds: an AssertionError naming ``what``. A callable ``what`` is asked only then, so the
    message can show the state the wait ended in (a log's tail, the counts reached). A predicate fails the wait at
    once by raising (the process it waits on died).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
