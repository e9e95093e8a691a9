"""/v1/batches through the openai SDK (sync and async) against a live server, with the store checked in SQL."""

from __future__ import annotations

import asyncio

import openai
import pytest
from sqlalchemy import select
from sqlalchemy import update

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import error_of
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item


def _create(client, file_id, **kw):
    return client.batches.create(
        input_file_id=file_id,
        endpoint=kw.pop("endpoint", CHAT),
        completion_window=kw.pop("completion_window", "24h"),
        **kw,
    )


def _set_status(rt, batch_id, status):
    with rt.store.transaction() as s:
        s.execute(update(Batch).where(Batch.id == batch_id).values(status=status))


def test_create_validates_inline_and_stores_items_in_prefix_order(acme, batch_file, rt):
    shared = "You are a careful translator. " * 4
    lines = [
        request_line("a", "zebra"),
        request_line("b", shared + "one"),
        request_line("c", "apple"),
        request_line("d", shared + "two"),
    ]
    b = _create(acme, batch_file(lines), metadata={"team": "search"})
    assert (b.object, b.status, b.endpoint, b.completion_window, b.model) == (
        "batch",
        "in_progress",
        CHAT,
        "24h",
        "tiny",
    )
    assert b.expires_at == b.created_at + rt.settings.completion_window_seconds
    assert b.in_progress_at is not None and b.failed_at is None and b.errors is None
    assert b.request_counts.model_dump() == {"total": 4, "completed": 0, "failed": 0}
    assert b.metadata == {"team": "search"}
    assert b.usage.model_dump() == {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    assert b.model_extra["tidal"] == {
        "priority": 100,
        "laxity_seconds": None,
        "observed_rate": None,
        "model_served": False,  # no worker node runs in this test: its items wait, queued
        "cost": {"batch_usd": 0.0, "online_usd": 0.0, "saved_usd": 0.0},
        "phase_split": "auto",
        "kv_stored_bytes": 0,
        "kv_storage_usd": 0.0,
    }
    with rt.store.read() as s:
        items = s.scalars(select(Item).where(Item.batch_id == b.id).order_by(Item.ordinal)).all()
    assert [i.custom_id for i in items] == ["b", "d", "c", "a"]  # by prompt prefix: the shared ones adjacent
    assert [i.line for i in items] == [2, 4, 3, 1] and {i.status for i in items} == {"pending"}
    assert acme.batches.retrieve(b.id) == b


def test_invalid_file_fails_the_batch_with_line_errors_and_queues_nothing(acme, batch_file, rt):
    lines = [
        request_line("ok"),
        "{not json",
        request_line("ok"),
        request_line("s", stream=True),
        request_line("u", url="/v1/embeddings"),
        {"custom_id": "m", "url": CHAT, "body": {"model": "tiny"}},
    ]
    b = _create(acme, batch_file(lines))
    assert b.status == "failed" and b.failed_at is not None and b.request_counts.total == 0
    assert [(e.code, e.line, e.param) for e in b.errors.data] == [
        ("invalid_json_line", 2, None),
        ("duplicate_custom_id", 3, "custom_id"),
        ("streaming_unsupported", 4, "body.stream"),
        ("invalid_url", 5, "url"),
        ("missing_required_parameter", 6, "method"),
    ]
    assert all(e.message for e in b.errors.data)
    with rt.store.read() as s:
        assert s.scalars(select(Item).where(Item.batch_id == b.id)).all() == []


def test_one_model_per_file(acme, batch_file):
    b = _create(acme, batch_file([request_line("1", model="a"), request_line("2", model="b")]))
    assert [(e.code, e.line, e.param) for e in b.errors.data] == [("mismatched_model", 2, "body.model")]


def test_create_parameter_errors(acme, batch_file, globex, http):
    fid = batch_file([request_line("1")])
    cases = [
        (
            {"input_file_id": fid, "endpoint": "/v1/moderations", "completion_window": "24h"},
            "invalid_value",
            "endpoint",
        ),
        ({"input_file_id": fid, "endpoint": CHAT, "completion_window": "48h"}, "invalid_value", "completion_window"),
        ({"endpoint": CHAT, "completion_window": "24h"}, "missing_required_parameter", "input_file_id"),
        ({"input_file_id": fid, "completion_window": "24h"}, "missing_required_parameter", "endpoint"),
        ({"input_file_id": fid, "endpoint": CHAT}, "missing_required_parameter", "completion_window"),
        ({"input_file_id": 7, "endpoint": CHAT, "completion_window": "24h"}, "invalid_type", "input_file_id"),
        (
            {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h", "metadata": ["x"]},
            "invalid_type",
            "metadata",
        ),
        (
            {
                "input_file_id": fid,
                "endpoint": CHAT,
                "completion_window": "24h",
                "metadata": {str(i): "v" for i in range(17)},
            },
            "invalid_value",
            "metadata",
        ),
        (
            {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h", "metadata": {"k" * 65: "v"}},
            "invalid_value",
            "metadata",
        ),
        (
            {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h", "metadata": {"k": "v" * 513}},
            "invalid_value",
            "metadata.k",
        ),
        (
            {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h", "metadata": {"k": 1}},
            "invalid_type",
            "metadata.k",
        ),
    ]
    for body, code, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            acme.post("/batches", cast_to=object, body=body)
        assert (e.value.code, e.value.param) == (code, param), body
    # the limits themselves are fine
    ok = _create(acme, fid, metadata={f"{i:064d}": "v" * 512 for i in range(16)})
    assert len(ok.metadata) == 16
    # not a batch file / not the caller's file / no file
    evals = acme.files.create(file=("e.jsonl", b"{}\n"), purpose="evals").id
    with pytest.raises(openai.BadRequestError) as e:
        _create(acme, evals)
    assert (e.value.code, e.value.param) == ("invalid_value", "input_file_id")
    for other in (
        globex.files.create(file=("g.jsonl", jsonl([request_line("1")])), purpose="batch").id,
        "file-doesnotexist",
    ):
        with pytest.raises(openai.NotFoundError) as e:
            _create(acme, other)
        assert e.value.param == "input_file_id"
    for raw in (b"not json", b"[1, 2]", b""):
        r = http.post("/v1/batches", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"


def test_retrieve_and_cancel_other_tenants_batch_is_404_like_unknown(acme, globex, batch_file, http):
    b = _create(acme, batch_file([request_line("1")]))
    for action in (lambda c, i: c.batches.retrieve(i), lambda c, i: c.batches.cancel(i)):
        with pytest.raises(openai.NotFoundError) as theirs:
            action(globex, b.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            action(globex, "batch_000000000000000000000000")
        assert (theirs.value.body["message"].replace(b.id, "<id>"), theirs.value.param, theirs.value.code) == (
            unknown.value.body["message"].replace("batch_000000000000000000000000", "<id>"),
            unknown.value.param,
            unknown.value.code,
        )
    r = http.get("/v1/batches/..%2F..%2Fx%27%20OR%201%3D1--")
    assert r.status_code == 404 and error_of(r)["message"] == "No batch found with id '../../x' OR 1=1--'."


@pytest.mark.parametrize("status", ["completed", "failed", "expired"])
def test_cancel_finished_batch_is_409(acme, batch_file, rt, status):
    b = _create(acme, batch_file([request_line("1")]))
    _set_status(rt, b.id, status)
    with pytest.raises(openai.ConflictError) as e:
        acme.batches.cancel(b.id)
    assert e.value.message.endswith(f"Cannot cancel a batch with status '{status}'.")
    assert e.value.type == "invalid_request_error"
    assert acme.batches.retrieve(b.id).status == status


@pytest.mark.parametrize("status", ["cancelling", "cancelled"])
def test_cancel_is_idempotent(acme, batch_file, rt, status):
    b = _create(acme, batch_file([request_line("1")]))
    _set_status(rt, b.id, status)
    assert acme.batches.cancel(b.id) == acme.batches.retrieve(b.id)
    assert acme.batches.retrieve(b.id).status == status


def test_five_batches_created_within_one_second_list_newest_first(acme, batch_file, rt):
    """created_at is whole seconds; the list order comes from the creation sequence, not from the random ids."""
    fid = batch_file([request_line("1")])
    made = [_create(acme, fid).id for _ in range(5)]
    with rt.store.transaction() as s:  # the same second for all five, however long the creates took here
        s.execute(update(Batch).where(Batch.id.in_(made)).values(created_at=1_700_000_000))
    assert [b.id for b in acme.batches.list().data] == made[::-1]
    assert [b.id for b in acme.batches.list(limit=2)] == made[::-1]  # cursor pages agree
    assert [b.id for b in acme.batches.list(after=made[2]).data] == made[1::-1]


def test_cancel_running_batch_goes_through_cancel_batch(acme, batch_file, rt):
    b = _create(acme, batch_file([request_line("1"), request_line("2")]))
    cancelled = acme.batches.cancel(b.id)
    with rt.store.read() as s:
        stored = s.get(Batch, b.id)
    # the answer is the batch as tidal_workers.cancel.cancel_batch left it in SQL
    assert cancelled.status == stored.status and cancelled.cancelling_at == stored.cancelling_at
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at is not None


def test_list_newest_first_with_cursor(acme, globex, batch_file):
    fid = batch_file([request_line("1")])
    made = [_create(acme, fid) for _ in range(5)]
    _create(globex, globex.files.create(file=("g.jsonl", jsonl([request_line("1")])), purpose="batch").id)
    newest_first = [b.id for b in made[::-1]]  # creation order, even within one second (the batches' seq)
    page = acme.batches.list()
    assert [b.id for b in page.data] == newest_first and not page.has_more
    first = acme.batches.list(limit=2)
    assert [b.id for b in first.data] == newest_first[:2] and first.has_more
    assert [b.id for b in acme.batches.list(limit=2)] == newest_first  # the SDK follows the cursor
    assert [b.id for b in acme.batches.list(after=newest_first[3]).data] == newest_first[4:]
    raw = acme.get("/batches", cast_to=object, options={"params": {"limit": 2}})
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (newest_first[0], newest_first[1], True)
    for params in ({"limit": 0}, {"limit": 101}):
        with pytest.raises(openai.BadRequestError) as e:
            acme.batches.list(**params)
        assert (e.value.code, e.value.param) == ("invalid_value", "limit")
    with pytest.raises(openai.NotFoundError) as e:
        acme.batches.list(after="batch_unknown")
    assert e.value.param == "after"


def test_async_client_round_trip(live_api, batch_file):
    fid = batch_file([request_line("1"), request_line("2")])

    async def main():
        async with openai.AsyncOpenAI(base_url=live_api.url + "/v1", api_key="acme-key", max_retries=0) as client:
            uploaded = await client.files.create(file=("a.jsonl", jsonl([request_line("x")])), purpose="batch")
            b = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h")
            got, listed, content = await asyncio.gather(
                client.batches.retrieve(b.id), client.batches.list(), client.files.content(uploaded.id)
            )
            with pytest.raises(openai.NotFoundError):
                await client.batches.retrieve("batch_nope")
            return b, got, listed, content

    b, got, listed, content = asyncio.run(main())
    assert got == b and b.status == "in_progress" and listed.data[0].id == b.id
    assert content.content == jsonl([request_line("x")])


def test_phase_split_option_is_validated_stored_and_shown(acme, batch_file, rt):
    fid = batch_file([request_line("1")])
    default = _create(acme, fid)
    assert default.model_extra["tidal"]["phase_split"] == "auto"  # the laxity-driven policy decides
    assert default.model_extra["tidal"]["kv_stored_bytes"] == 0
    assert default.model_extra["tidal"]["kv_storage_usd"] == 0
    never = _create(acme, fid, extra_body={"tidal": {"phase_split": "never"}})
    with rt.store.read() as s:
        assert s.get(Batch, never.id).phase_split == "never"
        assert s.get(Batch, default.id).phase_split == "auto"
    assert acme.batches.retrieve(never.id).model_extra["tidal"]["phase_split"] == "never"
    base = {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"}
    for tidal, code, param in [
        ({"phase_split": "sometimes"}, "invalid_value", "tidal.phase_split"),
        ({"phase_split": True}, "invalid_type", "tidal.phase_split"),
        ({"phase_splits": "always"}, "invalid_value", "tidal.phase_splits"),
        ("always", "invalid_type", "tidal"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            acme.post("/batches", cast_to=object, body={**base, "tidal": tidal})
        assert (e.value.code, e.value.param) == (code, param), tidal


def test_phase_split_always_is_the_operators_to_allow(acme, batch_file, rt):
    fid = batch_file([request_line("1")])
    with pytest.raises(openai.BadRequestError) as e:
        _create(acme, fid, extra_body={"tidal": {"phase_split": "always"}})
    assert (e.value.code, e.value.param) == ("invalid_value", "tidal.phase_split")
    assert "TIDAL_PHASE_SPLIT_ALWAYS" in e.value.message
    rt.settings = rt.settings.replace(phase_split_always=True)
    b = _create(acme, fid, extra_body={"tidal": {"phase_split": "always"}})
    assert acme.batches.retrieve(b.id).model_extra["tidal"]["phase_split"] == "always"


def test_storage_cost_follows_the_frozen_byte_seconds(acme, batch_file, rt):
    b = _create(acme, batch_file([request_line("1")]))
    gib_hours = 2.5
    with rt.store.transaction() as s:
        s.execute(
            update(Batch)
            .where(Batch.id == b.id)
            .values(kv_stored_bytes=12 * 1024 * 1500, kv_byte_seconds=gib_hours * 1024**3 * 3600)
        )
    tidal = acme.batches.retrieve(b.id).model_extra["tidal"]
    assert tidal["kv_stored_bytes"] == 12 * 1024 * 1500
    assert tidal["kv_storage_usd"] == pytest.approx(gib_hours * rt.settings.kv_storage_usd_per_gib_hour)
