"""Enqueue: put a validated batch's pending items into the Redis queue (being built)."""


def enqueue_batch(rt, batch_id: str) -> None:
    """Push every pending item of ``batch_id`` into the sorted sets (dispatch issue)."""
