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


def test_per_request_keeps_the_trace_order_and_a_failed_request_s_place():
    paired = samples.per_request([RECORD, FAILED, RECORD])
    assert paired["ttft"] == [[0.2], [], [0.2]]
    assert paired["tbt"][1] == [] and paired["tbt"][0] == pytest.approx([0.1, 0.1, 0.1])


def test_cumulative_tokens_count_a_prompt_at_its_first_token_and_each_token_when_it_came():
    opens = 100.0  # RECORD arrives at 101.0: first token at 101.2 (its 10 prompt tokens), 3 more at 101.5
    prompt, generated = samples.cumulative_tokens([RECORD, FAILED], opens, [101.1, 101.2, 101.4, 101.5, 200.0])
    assert list(prompt) == [0, 10, 10, 10, 10]
    assert list(generated) == [0, 1, 1, 4, 4]
