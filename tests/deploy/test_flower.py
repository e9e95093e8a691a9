"""`tidal flower` behind basic auth shows each item's `tidal.run_item` task, read back through Flower's REST API."""

from __future__ import annotations

import urllib.parse

import psutil
import pytest
import requests
from sqlalchemy import select

from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import on_stub
from tests.support.worker_helpers import spawn
from tests.support.worker_helpers import upload_batch
from tidal_engine.serve import free_port
from tidal_workers.store.models import Item

AUTH = ("admin", "s3cret")


@pytest.fixture
def settings(settings, stub):
    return on_stub(
        settings,
        stub,
        claim_idle_seconds=0.05,
        worker_threads=4,
        flower_port=free_port(),
        flower_basic_auth=":".join(AUTH),
    )


def _get(url: str, **kw):
    try:
        return requests.get(url, timeout=5, **kw)
    except requests.ConnectionError:
        return None


@pytest.mark.timeout(60)
def test_flower_shows_a_finished_item_task(rt, settings, live_api, children, tmp_path):
    flower = f"http://127.0.0.1:{settings.flower_port}"
    children.append(spawn(settings, "flower", "--address", "127.0.0.1", log=tmp_path / "flower.log"))
    wait_for(
        lambda: (r := _get(flower + "/api/workers", auth=AUTH)) is not None and r.status_code == 200,
        timeout=30,
        what="Flower to answer",
    )
    children.append(spawn(settings, "worker", "--loglevel=warning", log=tmp_path / "worker.log"))
    children.append(spawn(settings, "worker", "--ops", "--loglevel=warning", log=tmp_path / "ops.log"))  # finalizes

    batch_id = upload_batch(live_api.url, 3, tag="f")
    wait_for(lambda: batch_row(rt, batch_id).status == "completed", timeout=30, what="the batch to complete")

    def finished_item_tasks() -> dict:
        tasks = _get(flower + "/api/tasks", auth=AUTH, params={"taskname": "tidal.run_item"}).json()
        return {tid: t for tid, t in tasks.items() if t["state"] == "SUCCESS"}

    tasks = wait_for(
        lambda: len(finished_item_tasks()) == 3 and finished_item_tasks(),
        timeout=15,
        what="Flower to record the three item tasks",
    )

    with rt.store.read() as s:
        item_ids = sorted(s.scalars(select(Item.id).where(Item.batch_id == batch_id)))
    assert sorted(tasks) == [f"item-{i}#1" for i in item_ids]  # task id: the item id and its attempt
    task_id = f"item-{item_ids[0]}#1"
    info = _get(f"{flower}/api/task/info/{urllib.parse.quote(task_id, safe='')}", auth=AUTH)
    assert info.status_code == 200, info.text
    info = info.json()
    assert (info["uuid"], info["name"], info["state"]) == (task_id, "tidal.run_item", "SUCCESS")
    assert info["worker"] == f"tidal@{settings.node}"
    # /api/workers answers from a broadcast inspect; a worker busy with its last tasks can miss one round.
    wait_for(
        lambda: f"tidal@{settings.node}" in _get(flower + "/api/workers", auth=AUTH, params={"refresh": "1"}).json(),
        timeout=15,
        what="Flower to list the worker",
    )

    assert _get(flower + "/api/tasks").status_code == 401
    assert _get(flower + "/api/tasks", auth=("admin", "wrong")).status_code == 401
    # The credentials reach Flower in its environment, which only its owner reads, never on its command line,
    # which anyone on the host reads (`tidal flower` execs Flower in its own process).
    flower_proc = psutil.Process(children[0].pid)
    assert ":".join(AUTH) not in " ".join(flower_proc.cmdline()) and AUTH[1] not in " ".join(flower_proc.cmdline())
    assert flower_proc.environ()["FLOWER_BASIC_AUTH"] == ":".join(AUTH)
