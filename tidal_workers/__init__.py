"""Tidal's workers: the Celery app, ingest, the ZSET queue, the gate, execution and sweeps."""
