"""Cancel: stop a batch's claims at once, then finalize it as cancelled (being built by the dispatch work)."""


def cancel_batch(rt, batch_id: str) -> None:
    """Move ``batch_id`` to cancelling, drop its queued items and schedule its finalize (dispatch issue)."""
