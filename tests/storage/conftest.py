"""Fixtures for the storage tests: a real S3-compatible server (moto's standalone server) on a free port.

moto's server speaks the S3 protocol over HTTP; boto3 talks to it exactly as to AWS S3 or MinIO, with
path-style URLs. It is started once per session and each test gets a bucket of its own. If it cannot start,
the tests that need it fail with its log; they never skip.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
import requests

from tests.support import processes
from tests.support.storage_helpers import CREDENTIALS
from tests.support.storage_helpers import with_s3
from tests.support.wait import wait_for
from tidal_engine.serve import free_port


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """The URL of a moto S3 server started for this session."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Path(sys.executable).with_name("moto_server")
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, f"moto_server exited with {proc.returncode}: {log.read_text()[-2000:]}"
        try:
            return requests.get(url + "/moto-api/", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(answers, 60, lambda: f"moto_server to answer on {url}: {log.read_text()[-2000:]}", every=0.1)
        yield url
    finally:
        processes.stop(proc)


@pytest.fixture
def s3_client(s3_endpoint):
    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", **CREDENTIALS)


@pytest.fixture
def bucket(s3_client) -> str:
    name = f"tidal-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_settings(settings, s3_endpoint, bucket):
    """The test's settings with TIDAL_STORAGE=s3 on this test's bucket."""
    return with_s3(settings, s3_endpoint, bucket)
