"""Every process checks at start that it sees the fleet's file storage, and refuses to run when it does not.

The multi-host misconfiguration, made on one machine: two processes on the same Redis and SQL with different
blob directories (or another bucket or prefix) are exactly a worker on a GPU host with a local volume of its own.
"""

from __future__ import annotations

import pytest
import requests
from click.testing import CliRunner

from tests.support.storage_helpers import everything
from tests.support.storage_helpers import with_s3
from tests.support.wait import wait_for
from tests.support.worker_helpers import settings_env
from tests.support.worker_helpers import spawn
from tidal_api import create_app
from tidal_api.cli import main
from tidal_engine.serve import free_port
from tidal_workers import keys
from tidal_workers.blobs.sentinel import SENTINEL_PREFIX
from tidal_workers.blobs.sentinel import Sentinel
from tidal_workers.blobs.sentinel import StorageNotShared
from tidal_workers.blobs.sentinel import prepare_storage
from tidal_workers.blobs.sentinel import reset_sentinel
from tidal_workers.runtime import Runtime

REFUSAL = "cannot see the storage sentinel"


@pytest.fixture
def runtimes():
    """Runtimes a test builds (one per simulated process), closed at the end."""
    made: list[Runtime] = []

    def make(settings) -> Runtime:
        made.append(Runtime(settings))
        return made[-1]

    yield make
    for runtime in made:
        runtime.close()


def prepare(rt: Runtime, role: str) -> Sentinel:
    """What a process playing ``role`` runs at start, on its runtime's storage and Redis."""
    return prepare_storage(rt.blobs, rt.redis, role, rt.settings.node)


def reset(rt: Runtime, role: str) -> Sentinel:
    return reset_sentinel(rt.blobs, rt.redis, role, rt.settings.node)


def sentinels(rt: Runtime) -> list[str]:
    return [name for name in everything(rt.blobs) if name.rsplit("/", 1)[-1].startswith(SENTINEL_PREFIX)]


def test_processes_sharing_a_directory_agree_on_one_sentinel(rt, settings, runtimes):
    first = prepare(rt, "api")
    assert Sentinel.from_json(rt.redis.get(keys.STORAGE_SENTINEL)) == first
    again = prepare(runtimes(settings), "worker")
    assert again == first  # the second process saw the first one's sentinel
    assert sentinels(rt) == [first.name]  # its own probe was removed
    assert list(rt.blobs.names()) == []  # sentinels are not blobs


def test_a_process_on_another_directory_refuses_and_says_why(rt, settings, runtimes, tmp_path):
    first = prepare(rt, "api")
    other = runtimes(settings.replace(blob_dir=str(tmp_path / "elsewhere")))
    with pytest.raises(StorageNotShared) as refused:
        prepare(other, "worker")
    message = str(refused.value)
    assert first.name in message and first.by in message
    assert str(rt.settings.blob_path) in message and str(tmp_path / "elsewhere") in message
    assert "TIDAL_STORAGE=s3" in message and "tidal storage check --reset" in message
    assert sentinels(other) == []  # the refused process leaves nothing behind
    assert Sentinel.from_json(rt.redis.get(keys.STORAGE_SENTINEL)) == first  # the fleet's record is unchanged


def test_s3_bucket_and_prefix_must_match(rt, settings, runtimes, s3_endpoint, bucket, s3_client):
    on_s3 = with_s3(settings, s3_endpoint, bucket)
    first = prepare(runtimes(on_s3), "api")
    assert prepare(runtimes(on_s3), "worker") == first
    s3_client.create_bucket(Bucket=bucket + "-b")
    for elsewhere in (
        with_s3(settings, s3_endpoint, bucket, prefix="other/"),
        with_s3(settings, s3_endpoint, bucket + "-b"),
        settings,  # a local directory
    ):
        with pytest.raises(StorageNotShared, match=REFUSAL):
            prepare(runtimes(elsewhere), "worker")


def test_reset_records_the_new_storage(rt, settings, runtimes, tmp_path):
    prepare(rt, "api")
    moved = settings.replace(blob_dir=str(tmp_path / "moved"))
    new = reset(runtimes(moved), "operator")
    assert prepare(runtimes(moved), "worker") == new
    with pytest.raises(StorageNotShared, match=REFUSAL):
        prepare(runtimes(settings), "api")  # the old directory is no longer the fleet's


def test_the_api_refuses_to_start_on_other_storage(rt, settings, tmp_path):
    prepare(rt, "worker")
    with pytest.raises(StorageNotShared, match=REFUSAL):
        create_app(settings.replace(blob_dir=str(tmp_path / "elsewhere")))
    create_app(settings)  # on the fleet's storage it starts


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_worker_and_beat_processes_refuse_to_run_on_other_storage(rt, settings, children, tmp_path, command):
    prepare(rt, "api")
    log = tmp_path / f"{command}.log"
    proc = spawn(settings.replace(blob_dir=str(tmp_path / "elsewhere")), command, log=log)
    children.append(proc)
    code = wait_for(lambda: proc.poll() is not None and [proc.returncode], timeout=90, what=f"{command} to exit")[0]
    assert code != 0, log.read_text()[-3000:]
    assert REFUSAL in log.read_text(), log.read_text()[-3000:]


def test_a_worker_on_the_fleets_storage_runs(rt, settings, children, tmp_path):
    prepare(rt, "api")
    port = free_port()
    log = tmp_path / "worker.log"
    children.append(proc := spawn(settings.replace(worker_metrics_port=port), "worker", log=log))

    def alive() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    wait_for(alive, timeout=90, what="the worker's /health")
    assert REFUSAL not in log.read_text()


def test_storage_check_command(rt, settings, tmp_path):
    prepare(rt, "api")
    ok = CliRunner().invoke(main, ["storage", "check"], env=settings_env(settings))
    assert ok.exit_code == 0 and "is visible here" in ok.output, ok.output
    moved = settings_env(settings.replace(blob_dir=str(tmp_path / "moved")))
    refused = CliRunner().invoke(main, ["storage", "check"], env=moved)
    assert refused.exit_code == 1 and REFUSAL in refused.output, refused.output
    reset = CliRunner().invoke(main, ["storage", "check", "--reset"], env=moved)
    assert reset.exit_code == 0, reset.output
    assert str(tmp_path / "moved") in Sentinel.from_json(rt.redis.get(keys.STORAGE_SENTINEL)).location
