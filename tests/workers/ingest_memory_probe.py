"""Run by tests/workers/test_ingest_memory.py in a child process: ingest one batch, print memory as JSON.

Baseline: the process's resident set once everything ingest uses is imported and connected, just before it runs.
Peak: the kernel's high-water mark of the resident set (ru_maxrss) after it ran.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time

import psutil

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
    baseline = psutil.Process().memory_info().rss
    started = time.monotonic()
    ingest_batch(rt, batch_id)
    seconds = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"baseline": baseline, "peak": peak, "seconds": seconds}))


if __name__ == "__main__":
    main(sys.argv[1])
