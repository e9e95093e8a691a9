"""schemathesis against the OpenAPI document the live server serves: no 5xx, and every response fits the document.

Stateless: each documented operation gets generated requests, valid and invalid
(wrong types, missing fields, odd strings), sent with a real key over real HTTP.
Random ids only ever reach 404s, so about half of the valid cases have their ids
swapped for a real file's and batch's, which takes them to the 200 answers too.
Bounded by ``MAX_EXAMPLES`` per operation so the whole module stays well under a minute.
"""

from __future__ import annotations

import hypothesis
import pytest
import requests
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance
from schemathesis.specs.openapi.checks import response_schema_conformance
from schemathesis.specs.openapi.checks import status_code_conformance

MAX_EXAMPLES = 12
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


@pytest.fixture
def settings(settings):
    # generated uploads stay small, and the documented 413 stays reachable
    return settings.replace(max_file_bytes=4096, max_upload_bytes=8192)


@pytest.fixture
def served_schema(live_api):
    return schemathesis.openapi.from_url(live_api.url + "/openapi.json")


class Known:
    """acme's real file and batch; a DELETE gets a file of its own, so the shared one stays for the rest."""

    def __init__(self, url: str):
        self.url = url
        self.http = requests.Session()
        self.http.headers["Authorization"] = "Bearer acme-key"
        self.file_id = self.upload()
        self.batch_id = self.http.post(
            url + "/v1/batches",
            json={"input_file_id": self.file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()["id"]

    def upload(self) -> str:
        line = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny"}}\n'
        return self.http.post(
            self.url + "/v1/files", files={"file": ("in.jsonl", line)}, data={"purpose": "batch"}
        ).json()["id"]

    def use_in(self, case) -> None:
        if case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
            return
        ids = {
            "file_id": self.upload if case.method == "DELETE" else lambda: self.file_id,
            "input_file_id": lambda: self.file_id,
            "batch_id": lambda: self.batch_id,
        }
        for params in (case.path_parameters, case.body):
            if isinstance(params, dict):
                for name, value in params.items():
                    if name in ids and isinstance(value, str) and len(value) % 2 == 0:  # about half of them
                        params[name] = ids[name]()


@pytest.fixture
def known(live_api) -> Known:
    return Known(live_api.url)


schema = schemathesis.pytest.from_fixture("served_schema")


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(hypothesis.HealthCheck)
)
def test_served_document_holds(case, live_api, known):
    known.use_in(case)
    case.call_and_validate(base_url=live_api.url, headers={"Authorization": "Bearer acme-key"}, checks=CHECKS)
