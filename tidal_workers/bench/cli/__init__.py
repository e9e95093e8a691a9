"""`tidal bench ...`: benchmarks (not tests). Each writes NAME.json (provenance first) and its plots under --out.

The `tidal` command finds this group through the ``tidal.commands`` entry point (setup.cfg), so the product imports
nothing of the benchmarks; the experiments themselves live beside this package in tidal_workers/bench/.
"""

import click

from tidal_workers.bench.cli import engine_runs
from tidal_workers.bench.cli import frontier_runs
from tidal_workers.bench.cli import stack_runs


@click.group()
def bench() -> None:
    """Measurements of Tidal; each prints its headline as JSON and writes NAME.json and plots under --out."""


for command in (
    engine_runs.harvest,
    frontier_runs.frontier,
    frontier_runs.frontier_compare,
    engine_runs.gate,
    stack_runs.load,
    stack_runs.fleet,
    engine_runs.prefix,
    engine_runs.bound,
    engine_runs.twin,
    engine_runs.calibrate,
    engine_runs.kv_probe,
    engine_runs.disagg,
    engine_runs.virtual,
    stack_runs.fairness,
    stack_runs.dispatch,
    stack_runs.dispatch_compare,
    stack_runs.queue,
    stack_runs.chaos,
):
    bench.add_command(command)

__all__ = ["bench"]
