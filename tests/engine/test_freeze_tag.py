"""TidalFreezeConnector's tag: only a batch id that is one safe folder name selects a request for freezing."""

from __future__ import annotations

import pytest

from tidal_engine.freeze import TAG
from tidal_engine.freeze import tagged_batch
from tidal_workers.policy.phase import FREEZE_TAG
from tidal_workers.policy.phase import Phase
from tidal_workers.policy.phase import phase_request


@pytest.mark.parametrize(
    "params, batch",
    [
        ({TAG: "batch_0123abcd"}, "batch_0123abcd"),
        (None, None),  # an online request: no kv_transfer_params at all
        ({}, None),
        ({"do_remote_decode": True}, None),  # another connector's parameters
        ({TAG: 7}, None),
        ({TAG: ""}, None),
        ({TAG: ".."}, None),  # would name the folder's parent
        ({TAG: "."}, None),
        ({TAG: "../etc"}, None),
        ({TAG: "a/b"}, None),
        ({TAG: "x" * 129}, None),
        ("batch_1", None),
    ],
)
def test_tagged_batch(params, batch):
    assert tagged_batch(params) == batch


def test_the_workers_tag_what_the_connector_reads():
    """The workers' split requests (tidal_workers.policy.phase) carry the key this connector selects by."""
    assert FREEZE_TAG == TAG
    assert tagged_batch(phase_request({"messages": []}, Phase.DECODE, "batch_1")["kv_transfer_params"]) == "batch_1"
