"""Online latencies from the client's raw records, timed from each request's scheduled arrival."""

from __future__ import annotations

import pytest

from tidal_workers.bench import samples

pytestmark = pytest.mark.no_sql

# Sent 0.05 s late; first chunk at 0.2 s after the scheduled arrival; then one chunk of 3 tokens 0.3 s later.
RECORD = {"at": 1.0, "late": 0.05, "error": None, "prompt_tokens": 10, "chunks": [[0.2, 1], [0.5, 4]]}
FAILED = {"at": 2.0, "late": 0.0, "error": "http 500", "prompt_tokens": 0, "chunks": []}


def test_latencies_count_from_the_scheduled_arrival():
    assert samples.ttfts([RECORD, FAILED]) == [0.2]
    assert samples.e2es([RECORD]) == [0.5]
    assert samples.lateness([RECORD, FAILED]) == [0.05, 0.0]


def test_a_chunk_of_several_tokens_spreads_its_gap_over_them():
    assert samples.tbts([RECORD]) == pytest.approx([0.1, 0.1, 0.1])


def test_tokens_until_counts_only_what_arrived_inside_the_window():
    assert samples.tokens_until([RECORD], 1.3) == 1  # at 1.0 + 0.2
    assert samples.tokens_until([RECORD], 1.5) == 4
    assert samples.tokens_until([RECORD], 1.1) == 0


def test_summary_counts_errors():
    summary = samples.summary([RECORD, FAILED])
    assert summary["requests"] == 2
    assert summary["errors"] == 1
    assert summary["ttft_samples"] == 1
