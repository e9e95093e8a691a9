"""The Trickle, the benchmarks' and e2e tests' batch backlog: a dropped connection is sent again once, as a worker
resends an item whose engine call broke; a second drop is an error. On the fault stub (a real vLLM drops no
connection on demand)."""

from __future__ import annotations

from tests.support.wait import wait_for
from tidal_workers.bench import gate_trace
from tidal_workers.gate import FixedGate


def test_a_dropped_connection_is_sent_again_once_and_a_second_drop_is_an_error(stub):
    stub.script(gate_trace.BATCH_PROMPT, "abort")  # the first request: its connection closed, no answer
    with gate_trace.Trickle(stub.url, "m", FixedGate(1)) as backlog:
        wait_for(lambda: backlog.completed >= 3, 30, what="three answered requests")
    assert backlog.errors == []
    assert backlog.resent == 1
    assert stub.seen(gate_trace.BATCH_PROMPT) >= 4  # the dropped one, its resend, two more

    stub.script(gate_trace.BATCH_PROMPT, "abort", "abort")  # a request and its resend both dropped
    with gate_trace.Trickle(stub.url, "m", FixedGate(1)) as backlog:
        wait_for(lambda: backlog.completed >= 2, 30, what="a failed request and an answered one")
    assert len(backlog.errors) == 1 and backlog.errors[0].startswith("ConnectionError: "), backlog.errors
    assert backlog.resent == 1
