"""Engine outage or the item's own error: who pays for a failed request to the engine.

An engine that is down (restarting, loading a model, killed) is nobody's fault: the node stops claiming and hands
its items back with no retry used, however long the outage lasts. A request the engine fails while it is up is the
item's own error and spends the item's retry budget, so a request that always times out or always breaks its
connection cannot requeue for ever. The caller probes the engine's ``/health`` when :func:`needs_probe` says so and
passes the answer in.
"""

from __future__ import annotations

import enum


class Failure(enum.Enum):
    """How a request to the engine failed."""

    REFUSED = "refused"  # nothing listens on the engine's port: it is not running
    BROKEN = "broken"  # the connection was reset or closed mid-request, or the answer was not JSON
    TIMEOUT = "timeout"  # no answer within the request timeout (or no connection within it)
    SERVER_ERROR = "server_error"  # a 5xx
    BUSY = "busy"  # a 429: the engine is up and says so


def needs_probe(failure: Failure) -> bool:
    """Whether the engine's /health decides this failure (a refused connection needs no probe, a 429 none)."""
    return failure in (Failure.BROKEN, Failure.TIMEOUT, Failure.SERVER_ERROR)


def is_outage(failure: Failure, health_ok: bool | None) -> bool:
    """True: the engine is down (give the item back, retry nothing). False: the item's own transient error.

    ``health_ok`` is the probe's answer, or None where no probe was made.
    """
    if failure is Failure.REFUSED:
        return True
    return needs_probe(failure) and health_ok is False
