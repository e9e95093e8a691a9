"""The names Tidal's Celery messages travel under, written once: tasks and the ops worker's two queues.

Whoever sends a task (the API, the claim thread, beat's schedule in ``config/celery.py``)
and the worker that registers it use these constants, never string literals. Redis keys
Tidal owns are in ``keys.py``; Celery's own broker keys are named after these queues.
"""

from __future__ import annotations

#: Finalize and the sweeps: consumed by the ops worker's control process (``tidal worker --ops``), never by a GPU
#: node's worker, which takes only its own worker-direct queue (``<hostname>.dq2``); see ``config/celery.py``.
OPS_QUEUE = "tidal.ops"
#: Ingest, on its own queue and threads (the ops worker's ingest process): a queue full of long ingests never holds
#: a finalize or a sweep back.
INGEST_QUEUE = "tidal.ingest"

#: One claimed item, sent by the claim thread to its own worker's direct queue.
RUN_ITEM = "tidal.run_item"
#: Validate a large input file and create its items (the API sends it to ``INGEST_QUEUE``; reconcile resends it).
INGEST = "tidal.ingest"
#: Finalize one batch whose work may be over (``finalize.perform_finalize``), sent to ``OPS_QUEUE`` by the item task
#: that released its batch's last lease and by the HTTP cancel: a batch's files are never written on a GPU node's
#: claim path or inside an HTTP request.
FINALIZE = "tidal.finalize"
#: Beat's periodic sweeps (``sweeps.py``), sent to ``OPS_QUEUE``.
SWEEP_EXPIRE = "tidal.sweep.expire"
SWEEP_RECLAIM = "tidal.sweep.reclaim"
SWEEP_RECONCILE = "tidal.sweep.reconcile"
SWEEP_RESCORE = "tidal.sweep.rescore"
SWEEP_RETENTION = "tidal.sweep.retention"
