"""Auth over real HTTP: who gets in, what a stranger learns (nothing), and how keys are kept."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from sqlalchemy import delete
from sqlalchemy import event

from tidal_api import create_app
from tidal_workers.store import api_keys
from tidal_workers.store.models import ApiKey
from tidal_workers.store.models import Base
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item

CHAT = "/v1/chat/completions"
KEYS = ("acme-key", "globex-key", "tidal-dev-key")
LINE = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny"}}\n'


def call(url: str, method: str, path: str, key: str | None = "acme-key", **kw) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(method, url + path, headers=headers, timeout=30, **kw)


def error_code(r: requests.Response) -> str | None:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["code"]


def upload(url: str, key: str) -> str:
    r = call(url, "POST", "/v1/files", key, files={"file": ("in.jsonl", LINE)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def create_batch(url: str, key: str) -> str:
    r = call(
        url,
        "POST",
        "/v1/batches",
        key,
        json={"input_file_id": upload(url, key), "endpoint": CHAT, "completion_window": "24h"},
    )
    assert r.status_code == 200, r.text
    return r.json()["id"]


def v1_routes(app) -> list[tuple[str, str]]:
    """Every /v1 (method, path) the app serves, with a made-up id in place of each path variable."""
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/v1"):
            path = rule.rule.replace("<path:file_id>", "file-x").replace("<path:batch_id>", "batch_x")
            routes += [(m, path) for m in sorted(rule.methods - {"HEAD", "OPTIONS"})]
    return routes


@pytest.mark.parametrize(
    "header,code",
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Bearer", "missing_api_key"),
        ("Bearer ", "missing_api_key"),
        ("Bearer\tacme-key", "missing_api_key"),
        ("acme-key", "missing_api_key"),
        ("Basic YWNtZTphY21lLWtleQ==", "missing_api_key"),  # acme:acme-key, in the wrong scheme
        ("Token acme-key", "missing_api_key"),
        ("Bearer acme-key-", "invalid_api_key"),
        ("Bearer ACME-KEY", "invalid_api_key"),
        ("Bearer acme-key globex-key", "invalid_api_key"),
        ("bearer wrong-key", "invalid_api_key"),
        ("Bearer tidal-dev-key\x00", "invalid_api_key"),
    ],
)
def test_missing_malformed_and_wrong_keys_are_401_on_every_route(live_api, header, code):
    headers = {} if header is None else {"Authorization": header}
    for method, path in v1_routes(live_api.server.app):
        r = requests.request(method, live_api.url + path, headers=headers, timeout=30)
        assert r.status_code == 401, (method, path, header, r.text)
        assert error_code(r) == code, (method, path, header)
        assert "acme-key" not in r.text and "wrong-key" not in r.text  # a key is never echoed back


def test_bearer_scheme_is_case_insensitive(live_api):
    """RFC 7235 section 2.1: the auth scheme is case-insensitive, so `bearer <key>` is the same as `Bearer <key>`."""
    r = requests.get(live_api.url + "/v1/files", headers={"Authorization": "bearer acme-key"}, timeout=30)
    assert r.status_code == 200, r.text


def _same_response(a: requests.Response, b: requests.Response) -> None:
    assert (a.status_code, a.content) == (b.status_code, b.content)
    assert {k: v for k, v in a.headers.items() if k != "Date"} == {k: v for k, v in b.headers.items() if k != "Date"}


def test_another_tenants_file_is_byte_identical_to_an_unknown_one(live_api):
    url = live_api.url
    theirs = upload(url, "globex-key")
    probes = [
        ("GET", f"/v1/files/{theirs}", {}),
        ("GET", f"/v1/files/{theirs}/content", {}),
        ("DELETE", f"/v1/files/{theirs}", {}),
        ("GET", "/v1/files", {"params": {"after": theirs}}),
        ("POST", "/v1/batches", {"json": {"input_file_id": theirs, "endpoint": CHAT, "completion_window": "24h"}}),
    ]
    foreign = [call(url, method, path, **kw) for method, path, kw in probes]
    assert all(r.status_code == 404 for r in foreign), [r.text for r in foreign]
    assert call(url, "GET", f"/v1/files/{theirs}", "globex-key").status_code == 200  # it exists, for its owner
    assert call(url, "DELETE", f"/v1/files/{theirs}", "globex-key").status_code == 200  # now it exists for no one
    for (method, path, kw), before in zip(probes, foreign):
        _same_response(before, call(url, method, path, **kw))


def test_another_tenants_batch_is_byte_identical_to_an_unknown_one(live_api, rt):
    url = live_api.url
    theirs = create_batch(url, "globex-key")
    probes = [
        ("GET", f"/v1/batches/{theirs}", {}),
        ("POST", f"/v1/batches/{theirs}/cancel", {}),
        ("GET", "/v1/batches", {"params": {"after": theirs}}),
    ]
    foreign = [call(url, method, path, **kw) for method, path, kw in probes]
    assert all(r.status_code == 404 for r in foreign), [r.text for r in foreign]
    assert call(url, "GET", f"/v1/batches/{theirs}", "globex-key").json()["status"] == "in_progress"
    with rt.store.transaction() as s:  # batches cannot be deleted through the API: make the id unknown in SQL
        s.execute(delete(Item).where(Item.batch_id == theirs))
        s.execute(delete(Batch).where(Batch.id == theirs))
    for (method, path, kw), before in zip(probes, foreign):
        _same_response(before, call(url, method, path, **kw))


def _every_stored_value(rt) -> list:
    with rt.store.engine.connect() as c:
        return [value for table in Base.metadata.sorted_tables for row in c.execute(sa.select(table)) for value in row]


def test_keys_are_stored_only_as_sha256_digests(live_api, rt):
    create_batch(live_api.url, "acme-key")  # a store with files, batches and items in it, too
    with rt.store.read() as s:
        stored = {k.key_hash: k.tenant_id for k in s.scalars(sa.select(ApiKey))}
    assert stored == {
        hashlib.sha256(k.encode()).hexdigest(): t
        for t, k in (("acme", "acme-key"), ("globex", "globex-key"), ("dev", "tidal-dev-key"))
    }
    text = repr(_every_stored_value(rt))
    assert not [k for k in KEYS if k in text]
    if rt.settings.sqlalchemy_url.startswith("sqlite"):  # and not in the raw pages either (freed ones included)
        db = rt.store.engine.url.database
        raw = b"".join(Path(p).read_bytes() for p in (db, db + "-wal") if Path(p).exists())
        assert not [k for k in KEYS if k.encode() in raw]


def test_key_lookup_sends_only_the_digest_to_the_database(rt):
    """The secret is never compared byte by byte: it is hashed, and the digest is an indexed equality lookup,
    so response time cannot reveal how much of a guessed key is right."""
    sent: list[tuple[str, tuple]] = []

    def spy(conn, cursor, statement, parameters, context, executemany):
        sent.append((statement, parameters))

    event.listen(rt.store.engine, "before_cursor_execute", spy)
    try:
        assert api_keys.tenant_for_key(rt.store, "acme-key") == "acme"  # a read, and last_used_at written (first use)
        assert api_keys.tenant_for_key(rt.store, "acme-key") == "acme"  # a read only: last use is kept to the minute
        assert api_keys.tenant_for_key(rt.store, "acme-kex") is None
    finally:
        event.remove(rt.store.engine, "before_cursor_execute", spy)
    statements = [statement.split()[0] for statement, _ in sent]
    assert statements == ["SELECT", "UPDATE", "SELECT", "SELECT"], sent
    for (statement, parameters), key in zip(sent, ("acme-key", "acme-key", "acme-key", "acme-kex")):
        assert "api_keys.key_hash = " in statement or "key_hash=" in statement.replace(" ", ""), statement
        values = list(parameters.values()) if isinstance(parameters, dict) else list(parameters)
        assert hashlib.sha256(key.encode()).hexdigest() in values and key not in values


def test_dev_key_works_only_in_dev_mode(rt, live_api):
    assert call(live_api.url, "GET", "/v1/files", "tidal-dev-key").status_code == 200  # env=dev

    strong = "sk-" + secrets.token_urlsafe(32)  # production refuses weak keys such as acme-key
    prod_settings = rt.settings.replace(env="prod", api_keys=f"acme:{strong}")
    prod = type(live_api)(create_app(prod_settings))  # same store, same Redis: production mode
    try:
        r = call(prod.url, "GET", "/v1/files", "tidal-dev-key")
        assert r.status_code == 401 and error_code(r) == "invalid_api_key"
        assert call(prod.url, "GET", "/v1/files", strong).status_code == 200
        # a dev-mode process that starts later on the same store writes the dev key back; production still refuses it
        api_keys.sync(rt.store)
        r = call(prod.url, "GET", "/v1/files", "tidal-dev-key")
        assert r.status_code == 401 and error_code(r) == "invalid_api_key"
    finally:
        prod.stop()
        prod.server.app.extensions["tidal"].close()
