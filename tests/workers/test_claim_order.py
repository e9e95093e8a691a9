"""Claim order end to end: an ingested file's requests come out of the queue grouped by prompt prefix."""

from __future__ import annotations

import json

from sqlalchemy import select

from tests.support.worker_helpers import validating_batch
from tidal_workers.ingest import ingest_batch
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item

CHAT = "/v1/chat/completions"


def ingested(rt, prompts: list[str]) -> str:
    data = b"".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "m", "messages": [{"role": "user", "content": p}]},
            }
        ).encode()
        + b"\n"
        for i, p in enumerate(prompts)
    )
    batch_id = validating_batch(rt, data)
    ingest_batch(rt, batch_id)
    return batch_id


def test_claims_come_out_grouped_by_prompt_prefix_then_file_order(rt):
    shared = {g: f"system prompt {g}: " + "context " * 60 for g in "xyz"}
    prompts = [shared[g] + f"question {i}" for i, g in enumerate("xyzzyxxzyx")]  # interleaved in the file
    batch = ingested(rt, prompts)
    claimed = [c.item_id for c in rt.queue.claim("test-node", 20, 30, ["m"])]
    with rt.store.read() as s:
        line_of = dict(s.execute(select(Item.id, Item.line).where(Item.batch_id == batch)).all())
        assert s.get(Batch, batch).status == "in_progress"
    lines = [line_of[i] for i in claimed]
    groups = [prompts[line - 1][len("system prompt ")] for line in lines]
    assert groups == sorted(groups)  # each prefix group claimed together
    for g in "xyz":  # and inside a group, in file order
        inside = [line for line, grp in zip(lines, groups) if grp == g]
        assert inside == sorted(inside) and len(inside) == "xyzzyxxzyx".count(g)
