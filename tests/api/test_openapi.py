"""GET /openapi.json, checked against the live server: every documented status happens, every body fits its schema."""

from __future__ import annotations

import re
import time

import httpx
import jsonschema
import pytest
from sqlalchemy import update

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers.health import READY_CACHE_SECONDS
from tidal_workers.store.models import Batch


@pytest.fixture
def settings(settings):
    # globex may keep no batch open, so its create shows the documented 429
    return settings.replace(max_file_bytes=4096, max_upload_bytes=8192, tenant_limits='{"globex": {"open_batches": 0}}')


@pytest.fixture
def doc(live_api) -> dict:
    r = httpx.get(live_api.url + "/openapi.json")
    assert r.status_code == 200
    return r.json()


def test_document_is_valid_and_covers_every_route(doc, live_api):
    assert doc["openapi"].startswith("3.1")
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    routes = {
        (re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
        for rule in live_api.server.app.url_map.iter_rules()
        if rule.endpoint not in ("static", "metrics.metrics")  # /metrics: only on the metrics port, not documented
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops if method != "parameters"}
    assert routes == documented


def test_every_documented_response_happens_and_matches_its_schema(doc, live_api, rt):
    http = httpx.Client(base_url=live_api.url, headers={"Authorization": "Bearer acme-key"}, timeout=30)
    anon = httpx.Client(base_url=live_api.url, timeout=30)
    data = jsonl([request_line("1"), request_line("2")])

    def upload(purpose="batch", content=data):
        return http.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": purpose})

    fid = upload().json()["id"]
    doomed = upload().json()["id"]
    create = {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"}
    bid = http.post("/v1/batches", json=create).json()["id"]
    done = http.post("/v1/batches", json=create).json()["id"]
    with rt.store.transaction() as s:
        s.execute(update(Batch).where(Batch.id == done).values(status="completed"))

    def reused(path: str, first: dict, second: dict) -> httpx.Response:
        """The same Idempotency-Key with another request: 409."""
        headers = {"Idempotency-Key": f"reused-{path}"}
        assert http.post(path, headers=headers, **first).status_code == 200
        return http.post(path, headers=headers, **second)

    def over_quota() -> httpx.Response:
        with httpx.Client(base_url=live_api.url, headers={"Authorization": "Bearer globex-key"}, timeout=30) as globex:
            theirs = globex.post("/v1/files", files={"file": ("a", data)}, data={"purpose": "batch"}).json()["id"]
            return globex.post("/v1/batches", json={**create, "input_file_id": theirs})

    def not_ready(client: httpx.Client) -> httpx.Response:
        """/ready while the blob directory is gone (storage unreachable), then the directory back; /ready answers
        from checks up to READY_CACHE_SECONDS old, so it is asked until it follows."""
        rt.blobs.root.rename(rt.blobs.root.with_name("moved"))
        try:
            deadline = time.monotonic() + 5 * READY_CACHE_SECONDS
            while (r := client.get("/ready")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            return r
        finally:
            rt.blobs.root.with_name("moved").rename(rt.blobs.root)

    calls = {
        ("/openapi.json", "get", "200"): lambda: anon.get("/openapi.json"),
        ("/health", "get", "200"): lambda: anon.get("/health"),
        ("/ready", "get", "200"): lambda: anon.get("/ready"),
        ("/ready", "get", "503"): lambda: not_ready(anon),
        ("/v1/files", "post", "200"): upload,
        ("/v1/files", "post", "400"): lambda: upload(purpose="nope"),
        ("/v1/files", "post", "401"): lambda: anon.post("/v1/files", files={"file": ("a", b"x")}),
        ("/v1/files", "post", "409"): lambda: reused(
            "/v1/files",
            {"files": {"file": ("a.jsonl", data)}, "data": {"purpose": "batch"}},
            {"files": {"file": ("a.jsonl", data + data)}, "data": {"purpose": "batch"}},
        ),
        ("/v1/files", "post", "413"): lambda: upload(content=b"x" * 5000),
        ("/v1/files", "post", "415"): lambda: http.post("/v1/files", json={"purpose": "batch"}),
        ("/v1/files", "get", "200"): lambda: http.get("/v1/files", params={"limit": 1}),
        ("/v1/files", "get", "400"): lambda: http.get("/v1/files", params={"limit": 0}),
        ("/v1/files", "get", "401"): lambda: anon.get("/v1/files"),
        ("/v1/files", "get", "404"): lambda: http.get("/v1/files", params={"after": "file-nope"}),
        ("/v1/files/{file_id}", "get", "200"): lambda: http.get(f"/v1/files/{fid}"),
        ("/v1/files/{file_id}", "get", "401"): lambda: anon.get(f"/v1/files/{fid}"),
        ("/v1/files/{file_id}", "get", "404"): lambda: http.get("/v1/files/file-nope"),
        ("/v1/files/{file_id}", "delete", "200"): lambda: http.delete(f"/v1/files/{doomed}"),
        ("/v1/files/{file_id}", "delete", "401"): lambda: anon.delete(f"/v1/files/{fid}"),
        ("/v1/files/{file_id}", "delete", "404"): lambda: http.delete("/v1/files/file-nope"),
        ("/v1/files/{file_id}/content", "get", "200"): lambda: http.get(f"/v1/files/{fid}/content"),
        ("/v1/files/{file_id}/content", "get", "401"): lambda: anon.get(f"/v1/files/{fid}/content"),
        ("/v1/files/{file_id}/content", "get", "404"): lambda: http.get("/v1/files/file-nope/content"),
        ("/v1/batches", "post", "200"): lambda: http.post("/v1/batches", json={**create, "metadata": {"k": "v"}}),
        ("/v1/batches", "post", "400"): lambda: http.post("/v1/batches", json={**create, "endpoint": "/v1/x"}),
        ("/v1/batches", "post", "401"): lambda: anon.post("/v1/batches", json=create),
        ("/v1/batches", "post", "404"): lambda: http.post("/v1/batches", json={**create, "input_file_id": "f"}),
        ("/v1/batches", "post", "409"): lambda: reused(
            "/v1/batches", {"json": create}, {"json": {**create, "metadata": {"k": "other"}}}
        ),
        ("/v1/batches", "post", "413"): lambda: http.post(
            "/v1/batches", json={**create, "metadata": {"k": "v" * 70_000}}
        ),
        ("/v1/batches", "post", "429"): over_quota,
        ("/v1/batches", "get", "200"): lambda: http.get("/v1/batches", params={"limit": 1}),
        ("/v1/batches", "get", "400"): lambda: http.get("/v1/batches", params={"limit": 101}),
        ("/v1/batches", "get", "401"): lambda: anon.get("/v1/batches"),
        ("/v1/batches", "get", "404"): lambda: http.get("/v1/batches", params={"after": "batch_nope"}),
        ("/v1/batches/{batch_id}", "get", "200"): lambda: http.get(f"/v1/batches/{bid}"),
        ("/v1/batches/{batch_id}", "get", "401"): lambda: anon.get(f"/v1/batches/{bid}"),
        ("/v1/batches/{batch_id}", "get", "404"): lambda: http.get("/v1/batches/batch_nope"),
        ("/v1/batches/{batch_id}/cancel", "post", "200"): lambda: http.post(f"/v1/batches/{bid}/cancel"),
        ("/v1/batches/{batch_id}/cancel", "post", "401"): lambda: anon.post(f"/v1/batches/{bid}/cancel"),
        ("/v1/batches/{batch_id}/cancel", "post", "404"): lambda: http.post("/v1/batches/batch_nope/cancel"),
        ("/v1/batches/{batch_id}/cancel", "post", "409"): lambda: http.post(f"/v1/batches/{done}/cancel"),
    }
    documented = {
        (path, method, status)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method != "parameters"
        for status in op["responses"]
    }
    assert set(calls) == documented

    for (path, method, status), call in calls.items():
        response = call()
        assert str(response.status_code) == status, (path, method, status, response.text)
        ((media, spec),) = doc["paths"][path][method]["responses"][status]["content"].items()
        assert response.headers["content-type"].split(";")[0] == media, (path, method, status)
        if media == "application/json":
            schema = {**spec["schema"], "components": doc["components"]}
            jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)
    http.close()
    anon.close()
