"""The API process sends with a sending-only Celery app and loads none of the worker's code.

``lint-imports`` checks the same rule statically (setup.cfg, contract `api-sends-only`); this
checks what a real interpreter ends up loading once the app is built and has sent a task.
"""

from __future__ import annotations

import json
import subprocess
import sys

from config.settings import child_environ

WORKER_MODULES = {
    "tidal_workers.celery_app",
    "tidal_workers.claim",
    "tidal_workers.context",
    "tidal_workers.execute",
    "tidal_workers.gate",
    "tidal_workers.sweeps",
}

PROBE = """
import json, sys
from config import load_settings
from tidal_api import create_app
from tidal_workers.runtime import Runtime

rt = Runtime(load_settings())
app = create_app(runtime=rt)
with app.test_client() as client:
    client.get("/openapi.json")  # a request through the views: every blueprint is loaded
rt.celery.send_task("tidal.ingest", args=["batch_probe"], queue="tidal.ingest")
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("tidal_workers")),
    "tasks": sorted(name for name in rt.celery.tasks if name.startswith("tidal.")),
}))
"""


def test_the_api_process_loads_nothing_of_the_worker(rt):
    env = child_environ(TIDAL_REDIS_URL=rt.settings.redis_url, TIDAL_HOME=rt.settings.home)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert WORKER_MODULES.isdisjoint(seen["modules"]), sorted(WORKER_MODULES & set(seen["modules"]))
    assert "tidal_workers.runtime" in seen["modules"]  # the probe did build the API's Runtime
    assert seen["tasks"] == []  # sending needs names only: no task is registered
    # ... and the message reached the broker, as a worker would receive it
    message = json.loads(rt.redis.rpop("tidal.ingest"))
    assert message["headers"]["task"] == "tidal.ingest" and message["headers"]["argsrepr"] == "['batch_probe']"
