"""The worker tests' settings: the stub engine (tests/support/stub_engine.py, for the faults a real vLLM cannot make
on demand) and `QUICK`, so faults and recovery show up in seconds. The batch factory and the workers (`make_batch`,
`worker`) are tests/conftest.py's: the end-to-end tests (tests/e2e) use them too.
"""

from __future__ import annotations

import pytest

from tests.support.worker_helpers import QUICK


@pytest.fixture
def settings(settings, stub):
    return settings.replace(vllm_url=stub.url, **QUICK)
