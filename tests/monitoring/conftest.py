"""The monitoring tests reuse the worker tests' helpers (worker_helpers): put them on the path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))  # worker_helpers lives with the worker tests
