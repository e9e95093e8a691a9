"""Clients of the live API: the official openai SDK per tenant, and raw httpx for what the SDK cannot send."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.api_helpers import jsonl


def sdk(live_api, key: str) -> openai.OpenAI:
    # no retries: a 409 or 5xx must reach the test, not be retried away
    return openai.OpenAI(base_url=live_api.url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
def acme(live_api) -> openai.OpenAI:
    with sdk(live_api, "acme-key") as client:
        yield client


@pytest.fixture
def globex(live_api) -> openai.OpenAI:
    with sdk(live_api, "globex-key") as client:
        yield client


@pytest.fixture
def http(live_api) -> httpx.Client:
    """Raw HTTP with acme's key, for requests the SDK will not build."""
    with httpx.Client(base_url=live_api.url, headers={"Authorization": "Bearer acme-key"}, timeout=30) as client:
        yield client


@pytest.fixture
def batch_file(acme):
    """Upload JSONL for purpose batch; returns the file id."""

    def upload(lines: list, name: str = "input.jsonl") -> str:
        return acme.files.create(file=(name, jsonl(lines)), purpose="batch").id

    return upload
