"""The engine-outage rule: which failed requests cost the item a retry."""

from __future__ import annotations

import pytest

from tidal_workers.policy.outage import Failure
from tidal_workers.policy.outage import is_outage
from tidal_workers.policy.outage import needs_probe


def test_a_refused_connection_is_an_outage_without_a_probe():
    assert not needs_probe(Failure.REFUSED)
    assert is_outage(Failure.REFUSED, None)


@pytest.mark.parametrize("failure", [Failure.BROKEN, Failure.TIMEOUT, Failure.SERVER_ERROR])
def test_a_timeout_a_broken_connection_or_a_5xx_is_decided_by_health(failure):
    assert needs_probe(failure)
    assert is_outage(failure, health_ok=False)  # /health fails too: the engine is down
    assert not is_outage(failure, health_ok=True)  # /health passes: the item's own error, from its budget


def test_a_429_is_the_items_own_error():
    assert not needs_probe(Failure.BUSY)
    assert not is_outage(Failure.BUSY, None)
