"""The batch's `tidal.cost`: its completed items' usage at the batch price, read through the API."""

from __future__ import annotations

import json

import pytest

from tests.support.api_helpers import request_line
from tidal_workers.finalize import perform_finalize
from tidal_workers.policy.pricing import Usage
from tidal_workers.result import Entry
from tidal_workers.result import Outcome
from tidal_workers.result import record
from tidal_workers.store.models import ItemStatus

PRICES = {"tiny": [2.0, 8.0], "*": [1.0, 1.0]}  # online USD per 1M input, output tokens


@pytest.fixture
def settings(settings):
    return settings.replace(prices=json.dumps(PRICES), batch_discount=0.4)


def _finish(rt, n: int, outcomes: list[Outcome]) -> None:
    """Claim the queued items as a worker would and record one outcome each."""
    claims = rt.queue.claim(rt.settings.node, n, rt.settings.lease_seconds, ["tiny", "other"])
    assert len(claims) == n
    for claim, outcome in zip(claims, outcomes):
        assert record(rt, Entry(claim.attempt, claim.batch_id, outcome))
    perform_finalize(rt, claims[0].batch_id)  # the ops worker's part, once the last item settled


def test_cost_bills_only_completed_items_at_the_discount(rt, acme, batch_file):
    b = acme.batches.create(
        input_file_id=batch_file([request_line(f"r{i}") for i in range(3)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert b.model_extra["tidal"]["cost"] == {"batch_usd": 0.0, "online_usd": 0.0, "saved_usd": 0.0}

    done = Usage(input_tokens=1000, cached_tokens=200, output_tokens=500, reasoning_tokens=100)
    _finish(
        rt,
        3,
        [
            Outcome(ItemStatus.completed, 200, body="{}", usage=done),
            Outcome(ItemStatus.completed, 200, body="{}", usage=done),
            # A failed item's usage is kept on its row but never billed.
            Outcome(ItemStatus.failed, 400, body="{}", usage=Usage(input_tokens=10**6, output_tokens=10**6)),
        ],
    )
    b = acme.batches.retrieve(b.id)
    assert b.status == "completed" and b.request_counts.completed == 2 and b.request_counts.failed == 1
    assert (b.usage.input_tokens, b.usage.output_tokens) == (2000, 1000)
    online = (2000 * 2.0 + 1000 * 8.0) / 1e6  # the `tiny` row, not `*`
    assert b.model_extra["tidal"]["cost"] == pytest.approx(
        {"batch_usd": 0.4 * online, "online_usd": online, "saved_usd": 0.6 * online}, abs=1e-9
    )
    listed = acme.batches.list().data
    assert [x.model_extra["tidal"]["cost"] for x in listed] == [b.model_extra["tidal"]["cost"]]


def test_a_model_without_a_row_is_priced_by_the_default(rt, acme, batch_file):
    b = acme.batches.create(
        input_file_id=batch_file([request_line("r0", model="other")]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    _finish(
        rt, 1, [Outcome(ItemStatus.completed, 200, body="{}", usage=Usage(input_tokens=300_000, output_tokens=200_000))]
    )
    cost = acme.batches.retrieve(b.id).model_extra["tidal"]["cost"]
    assert cost == pytest.approx({"batch_usd": 0.2, "online_usd": 0.5, "saved_usd": 0.3}, abs=1e-9)
