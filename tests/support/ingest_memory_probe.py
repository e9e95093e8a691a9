"""Run by tests/workers/test_ingest_memory.py as a script in a child process: ingest one batch, print memory as JSON.

Baseline: the process's resident set once everything ingest uses is imported and connected, just before it runs.
Peak: the kernel's high-water mark of this process's resident set (``VmHWM``), reset at the baseline. Not
``ru_maxrss``: after a vfork-and-exec it still holds the parent's resident set (a pytest process of 200 MB).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

from config import load_settings
from tidal_workers.ingest import ingest_batch
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch


def main(batch_id: str) -> None:
    rt = Runtime(load_settings())
    with rt.store.read() as s:
        assert s.get(Batch, batch_id) is not None  # the store's connection is open before the baseline
    rt.redis.ping()
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    baseline = _status("VmRSS")
    started = time.monotonic()
    ingest_batch(rt, batch_id)
    seconds = time.monotonic() - started
    print(json.dumps({"baseline": baseline, "peak": _status("VmHWM"), "seconds": seconds}))


def _status(field: str) -> int:
    """A memory figure of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise KeyError(field)


if __name__ == "__main__":
    main(sys.argv[1])
