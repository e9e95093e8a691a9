"""The worker tests' settings: the stub engine (tests/support/stub_engine.py, for the faults a real vLLM cannot make
on demand) and `QUICK`, so faults and recovery show up in seconds. The batch factory and the workers (`make_batch`,
`worker`) are tests/conftest.py's: the end-to-end tests (tests/e2e) use them too.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.support.worker_helpers import QUICK


@pytest.fixture
def settings(settings, stub):
    return settings.replace(vllm_url=stub.url, **QUICK)


@pytest.fixture
def empty_store_url(database_url, tmp_path):
    """An empty database of the session's kind, for a migration test to build from an old revision."""
    if database_url is None:
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    admin = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    name = f"tidal_mig_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield admin.url.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
