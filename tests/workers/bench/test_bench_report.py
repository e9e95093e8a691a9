"""The harvest report from phase records: figures per repetition, and no figure from fewer than three."""

from __future__ import annotations

import pytest

from tidal_workers.bench import harvest_report
from tidal_workers.bench import samples

pytestmark = pytest.mark.no_sql


def _records(ttft: float, gap: float, tokens: int = 4, n: int = 20) -> list[dict]:
    """``n`` online requests, each with its first token at ``ttft`` and one token every ``gap`` after."""
    return [
        {
            "at": i * 0.1,
            "late": 0.0,
            "error": None,
            "prompt_tokens": 100,
            "chunks": [[ttft + k * gap, k + 1] for k in range(tokens)],
        }
        for i in range(n)
    ]


def _phases(reps: int, slow: float = 1.5, technique: str = "outside", batch: float = 700.0) -> list[dict]:
    """Per repetition: a ceiling of 1,000 tokens/s; a baseline; a co-served run at ``batch`` tokens/s (+ the
    repetition's number), ``slow``× slower."""
    phases = []
    for rep in range(reps):
        base = _records(0.1, 0.02)
        co = _records(0.1 * slow, 0.02 * slow)
        phases += [
            {"rep": rep, "technique": technique, "phase": "ceiling", "trace": None, "batch_tokens_per_s": 1000.0},
            {
                "rep": rep,
                "technique": technique,
                "phase": "baseline",
                "trace": "flat",
                "records": base,
                "summary": samples.summary(base),
                "batch_tokens_per_s": 0.0,
            },
            {
                "rep": rep,
                "technique": technique,
                "phase": "coserved",
                "trace": "flat",
                "records": co,
                "summary": samples.summary(co),
                "batch_tokens_per_s": batch + rep,
            },
        ]
    return phases


def test_three_repetitions_give_every_figure_with_an_interval():
    summary = harvest_report.intervals(_phases(3))["outside"]["flat"]
    assert summary["harvest_pct"]["per_rep"] == [70.0, 70.1, 70.2]
    assert summary["harvest_pct"]["interval"]["value"] == pytest.approx(70.1)
    assert summary["inflation_ttft_p50"]["interval"]["value"] == pytest.approx(1.5)
    table = harvest_report.table(_phases(3))
    assert "70.1 % [70.0, 70.2]" in table
    assert "1.50× [1.50, 1.50]" in table
    assert "refused" not in table
    assert "69.3 % flat" in table  # the seed's figure beside


def test_fewer_than_three_repetitions_print_no_harvest_or_inflation_figure():
    summary = harvest_report.intervals(_phases(1))["outside"]["flat"]
    assert "interval" not in summary["harvest_pct"]
    assert summary["harvest_pct"]["refused"].startswith("1 repetition")
    table = harvest_report.table(_phases(1))
    harvest_row = next(line for line in table.splitlines() if line.startswith("| harvest"))
    assert "refused" in harvest_row
    assert "70.0" not in harvest_row
    inflation_rows = [line for line in table.splitlines() if "inflation" in line]
    assert inflation_rows
    assert all("refused" in line and "1.50" not in line for line in inflation_rows)


def test_unchanged_latency_reads_no_measurable_change():
    table = harvest_report.table(_phases(3, slow=1.0))
    assert "| ttft p50 inflation | no measurable change" in table


def test_inside_against_outside_is_a_paired_ratio_under_the_same_rule():
    same = harvest_report.table(_phases(3) + _phases(3, technique="inside"))
    assert "inside ÷ outside harvest, flat (same repetition): no measurable change" in same
    more = harvest_report.table(_phases(3) + _phases(3, technique="inside", batch=800.0))
    assert "inside ÷ outside harvest, flat (same repetition): 1.14× [1.14, 1.14]" in more
    assert "refused" in harvest_report.table(_phases(2) + _phases(2, technique="inside")).splitlines()[-1]


def test_reports_that_named_the_techniques_a_and_b_read_as_outside_and_inside():
    old = _phases(3, technique="A") + _phases(3, technique="B", batch=800.0)
    assert set(harvest_report.intervals(old)) == {"outside", "inside"}
    assert "inside ÷ outside harvest, flat (same repetition): 1.14× [1.14, 1.14]" in harvest_report.table(old)
