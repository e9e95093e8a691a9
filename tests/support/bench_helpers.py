"""Helpers of the benchmark tests: a frontier plan as `tidal bench frontier --quick` makes it, or changed."""

from __future__ import annotations

import dataclasses

from tidal_workers.bench import frontier_plan as fp


def frontier_plan(**changes) -> fp.FrontierPlan:
    """The quick plan on one profile and load (the default techniques, each at its quick knobs), with ``changes``."""
    base = fp.FrontierPlan(
        profile="qwen2.5-7b@a6000",
        loads=("flat-8",),
        mixes=("standard",),
        techniques=fp.DEFAULT_TECHNIQUES,
        knobs={tech: fp.QUICK_KNOBS[tech] for tech in fp.DEFAULT_TECHNIQUES},
        gate_ceiling=185,
        reps=1,
        window_s=120.0,
        diurnal_window_s=600.0,
        settle_max_s=180.0,
        hold_s=20.0,
        baseline_lead_s=20.0,
        ceiling=True,
    )
    return dataclasses.replace(base, **changes)
