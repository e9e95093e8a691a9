"""The frontier's plan: which points it measures, in which order, and the run directory that lets it resume.

A point is one measured window:

- ``ceiling``: every slot of the stock engine full of batch work (once per batch mix), for "% of the steady
  ceiling";
- ``online-alone``: the online load alone on the stock engine, the reference of every inflation in its block;
- ``coserved``: the online load beside the batch, one technique at one setting of its knob:
  ``outside`` (Tidal's gate in front of vLLM's stock scheduler; knob: the gate's ceiling, batch requests at the
  engine), ``inside`` (TidalScheduler behind a fixed gate at the deployment's ceiling; knob: its α_set, each step at most
  that times T̂ of its online work alone, step_budget.py), ``outside-latency`` (the latency gate, TIDAL_GATE_MODE=latency, in
  front of the stock scheduler; knob: its α_set; not in the default arms), ``outside-staged`` (``outside`` with staged
  prefill, TIDAL_PREFILL_STAGE_TOKENS=``STAGE_TOKENS``: each batch prompt warmed in the prefix cache a chunk a step;
  knob: the gate's ceiling; not in the default arms) and ``vllm-priority`` (no Tidal: the batch posted straight to vLLM at the lowest priority; knob: its
  fixed concurrency).

A block is one online load beside one batch mix in one repetition. Its points alternate between the techniques
(A B C, C B A, ... over the knob settings, low to high), with the online-alone window in the middle, and every
other block runs in reverse order: drift in the machine falls on every arm alike (ABBA).

The run directory holds ``plan.json`` and one ``points/NAME.json`` per point measured, each written whole when its
point ends (or ``NAME.json.xz``, as docs/results keeps a run: read, and resumed from, as it is). A run started again with the same plan skips the points already there; a different plan is refused.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import os
import traceback
import typing as t
from pathlib import Path

from tidal_engine.step_time import TIME_SCALE_MARK
from tidal_workers.bench import online
from tidal_workers.bench.workload import OnlineLoad

TECHNIQUES = ("outside", "inside", "vllm-priority", "outside-latency", "outside-staged")
GATE_CEILING_KNOBS = ("outside", "outside-staged")  # the techniques whose knob is the AIMD gate's ceiling
STOCK_GATE_ARMS = ("outside", "outside-latency")  # a gate in front of the stock scheduler: what stage_tokens stages
# outside-staged's chunk: the twin's KV block (vLLM's CPU backend's, 128 tokens), the smallest the prefix cache keeps
STAGE_TOKENS = 128
DEFAULT_TECHNIQUES = ("outside", "inside", "vllm-priority")
CEILING, ONLINE_ALONE, COSERVED = "ceiling", "online-alone", "coserved"
# The knobs, low to high harvest. The gate's ceiling tops out at the deployment's (``gate_ceiling``).
FULL_KNOBS = {
    "outside": (6, 12, 24, 64),
    "inside": (1.05, 1.1, 1.2, 1.5, 2.5),  # the first run measured 1.20× online TBT p50 at α_set 1.1
    "vllm-priority": (4, 8, 16, 32, 64),
    "outside-latency": (1.05, 1.1, 1.2, 1.5, 2.0),
    "outside-staged": (6, 12, 24, 64),
}
QUICK_KNOBS = {
    "outside": (8, 32),
    "inside": (1.1, 1.5, 4.0),
    "vllm-priority": (4, 16, 64),
    "outside-latency": (1.1, 1.5),
    "outside-staged": (8, 32),
}
KNOB_NAMES = {
    "outside": "gate ceiling (batch requests at the engine)",
    "outside-latency": "the latency gate's α_set (online inter-token latency ÷ its fitted online-alone reference)",
    "inside": "TidalScheduler's α_set (a step ÷ T̂ of its online work alone)",
    "vllm-priority": "batch requests at the engine (fixed)",
    "outside-staged": "gate ceiling (batch requests at the engine), prompts staged through the prefix cache",
}

STEP_AT_S = 60.0  # a step load's window: this long at the rate before, then window_s at the rate after

# Seconds, for the estimate printed before a run (measured on nothing yet: the lead's first run corrects them).
ENGINE_START_S = 60.0
STACK_START_S = 40.0
SETTLE_GUESS_S = 90.0
DRAIN_S = 30.0
TAIL_S = 20.0  # the measured online requests still answering after the window


@dataclasses.dataclass(frozen=True)
class Point:
    kind: str
    mix: str
    rep: int
    load: str | None = None  # None for the ceiling
    technique: str | None = None  # coserved only
    knob: float | None = None

    @property
    def name(self) -> str:
        """The point's file name (without .json): what the run directory knows it by."""
        parts = [self.kind, self.load, self.mix]
        if self.technique is not None:
            parts.append(f"{self.technique}-{self.knob:g}")
        return "__".join(p for p in parts if p) + f"__r{self.rep}"

    def as_dict(self) -> dict[str, t.Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class FrontierPlan:
    profile: str
    loads: tuple[str, ...]
    mixes: tuple[str, ...]
    techniques: tuple[str, ...]
    knobs: dict[str, tuple[float, ...]]
    gate_ceiling: int  # the deployment's: outside's top knob setting, and inside's fixed gate
    reps: int
    window_s: float  # a flat window, at least; a diurnal one lasts one period, diurnal_window_s
    diurnal_window_s: float
    settle_max_s: float  # a window opens at the latest this long after the batch flows, settled or not
    hold_s: float  # admission holds its level this long (steady.admission)
    baseline_lead_s: float  # online alone runs this long before its window opens
    ceiling: bool
    # A flat co-served window that would close with fewer than steady.MIN_COMPLETIONS batch completions runs on to
    # hold them, up to this long (frontier.py, ``window_length``); online alone runs this long, so that every
    # co-served window's online requests are a prefix of its trace. 0: windows are window_s.
    window_max_s: float = 0.0
    # Every twin step k times as long, the online arrivals k times as far apart, Tidal's control periods and every
    # window k times as long (issue 35, item 8): seconds in the plan are the GPU's, the wall clock runs k times
    # slower, and the report converts back (harvest × k, latencies ÷ k; inflations are ratios).
    time_scale: float = 1.0
    seed: int = 7
    # The batch prompts of STOCK_GATE_ARMS staged through the prefix cache this many tokens a request
    # (TIDAL_PREFILL_STAGE_TOKENS; 0: sent whole). outside-staged stages at STAGE_TOKENS whatever this says.
    stage_tokens: int = 0
    # Staged arms' floor: prompts of this many tokens or fewer go whole (TIDAL_PREFILL_STAGE_MIN_TOKENS); 0, what
    # the plans written before it ran: every prompt longer than a chunk staged.
    stage_min_tokens: int = 0
    # outside-latency's reference ITL in ms (TIDAL_GATE_REFERENCE_ITL_MS: given, e.g. from a calibration or an
    # online-alone window); 0: the gate fits it, or takes it from the profile with gate_profile
    gate_reference_ms: float = 0.0
    # outside-latency's reference from the twin's profile (TIDAL_GATE_PROFILE: the twin_profile, time-scaled with it)
    gate_profile: bool = False

    @property
    def twin_profile(self) -> str:
        """The profile the twin and the plugin run: the plan's, time-scaled (the oracle prices the plan's own)."""
        return self.profile if self.time_scale == 1 else f"{self.profile}{TIME_SCALE_MARK}{self.time_scale:g}"

    def stage_tokens_for(self, technique: str) -> int:
        """The chunk ``technique``'s worker stages each batch prompt in (0: the prompt goes whole)."""
        if technique == "outside-staged":
            return STAGE_TOKENS
        return self.stage_tokens if technique in STOCK_GATE_ARMS else 0

    def knob_values(self, technique: str) -> tuple[float, ...]:
        values = tuple(self.knobs.get(technique, ()))
        if technique in GATE_CEILING_KNOBS:
            values = tuple(sorted({*(v for v in values if v < self.gate_ceiling), self.gate_ceiling}))
        return values

    def points(self) -> list[Point]:
        """Every point in the order it is measured (module docstring)."""
        out: list[Point] = []
        measured_ceilings: set[str] = set()
        block = 0
        for rep in range(self.reps):
            for load in self.loads:
                for mix in self.mixes:
                    if self.ceiling and mix not in measured_ceilings:
                        measured_ceilings.add(mix)
                        out.append(Point(CEILING, mix, 0))
                    arms = self._arms(load, mix, rep)
                    half = len(arms) // 2
                    ordered = [*arms[:half], Point(ONLINE_ALONE, mix, rep, load), *arms[half:]]
                    out += ordered if block % 2 == 0 else ordered[::-1]
                    block += 1
        return out

    def _arms(self, load: str, mix: str, rep: int) -> list[Point]:
        knobs = {tech: self.knob_values(tech) for tech in self.techniques}
        arms = []
        for i in range(max((len(k) for k in knobs.values()), default=0)):
            order = self.techniques if i % 2 == 0 else self.techniques[::-1]
            arms += [Point(COSERVED, mix, rep, load, tech, knobs[tech][i]) for tech in order if i < len(knobs[tech])]
        return arms

    def window_for(self, load_trace: str) -> float:
        """A window's planned length (a flat co-served one may run on to ``longest_window_for``); a step's window
        opens ``STEP_AT_S`` before the step."""
        if load_trace == "diurnal":
            return self.diurnal_window_s
        return STEP_AT_S + self.window_s if load_trace == "step" else self.window_s

    def longest_window_for(self, load_trace: str) -> float:
        """The longest a window of this trace runs: the length of its measured online trace."""
        return max(self.window_s, self.window_max_s) if load_trace == "flat" else self.window_for(load_trace)

    def expected_s(self, points: t.Sequence[Point], traces: t.Mapping[str, str]) -> float:
        """Wall time of ``points``, roughly: what the command prints before it starts."""
        total = ENGINE_START_S  # the stock engine
        for p in points:
            window = self.window_s if p.load is None else self.window_for(traces[p.load])
            if p.kind == CEILING:
                total += SETTLE_GUESS_S + window + DRAIN_S
            elif p.kind == ONLINE_ALONE:
                total += self.baseline_lead_s + self.longest_window_for(traces[str(p.load)]) + TAIL_S
            else:
                settle = min(SETTLE_GUESS_S, self.settle_max_s)
                total += settle + window + TAIL_S + DRAIN_S
                total += STACK_START_S if p.technique != "vllm-priority" else 0.0
                total += ENGINE_START_S if p.technique == "inside" else 0.0
        return total

    def as_dict(self) -> dict[str, t.Any]:
        """As plan.json holds it (tuples as lists, so that a plan read back compares equal)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def rate_fn(load: OnlineLoad, window_s: float) -> t.Callable[[float], float]:
    """The load's online rate over its window (a diurnal load's window is one period; a step's comes
    ``STEP_AT_S`` into it, and its lead-in runs at the rate before)."""
    if load.trace == "diurnal":
        return online.diurnal(load.rate, load.amplitude, window_s)
    if load.trace == "step":
        return online.step(load.step_from, load.rate, STEP_AT_S)
    return online.flat(load.rate)


class PlanMismatch(ValueError):
    """The run directory holds another plan: resuming it with this one would mix two experiments."""


class RunDir:
    """plan.json and points/NAME.json under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self.points_dir = root / "points"

    def open(self, plan: FrontierPlan) -> None:
        """Start a run here, or resume one with the same plan; PlanMismatch naming what differs otherwise."""
        self.points_dir.mkdir(parents=True, exist_ok=True)
        path = self.root / "plan.json"
        wanted = plan.as_dict()
        if path.exists():
            held = self._plan_fields()
            if held != wanted:
                keys = sorted(k for k in {*held, *wanted} if held.get(k) != wanted.get(k))
                raise PlanMismatch(
                    f"{self.root} holds a run with another plan ({', '.join(keys)} differ): "
                    "run with its options again to resume it, or give another --out"
                )
            return
        _write(path, wanted)

    def plan(self) -> FrontierPlan:
        """The plan the run here was started with."""
        return FrontierPlan(**self._plan_fields())

    def _plan_fields(self) -> dict[str, t.Any]:
        """plan.json's fields, and a field added since at its default (what a plan written before it meant)."""
        return {**_defaults(), **json.loads((self.root / "plan.json").read_text())}

    def path(self, point: Point) -> Path:
        return self.points_dir / f"{point.name}.json"

    def done(self, point: Point) -> bool:
        path = self.path(point)
        return path.exists() or _packed(path).exists()

    def write(self, point: Point, record: dict[str, t.Any]) -> Path:
        path = self.path(point)
        _write(path, {"point": point.as_dict(), **record})
        return path

    def fail(self, point: Point, error: BaseException) -> Path:
        """A point that raised: its error kept under failed/, where a resumed run does not look (it measures the
        point again)."""
        path = self.root / "failed" / f"{point.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, {"point": point.as_dict(), "error": "".join(traceback.format_exception(error))})
        return path

    def failures(self) -> list[dict[str, t.Any]]:
        """Points that failed and have not been measured since."""
        found = [json.loads(p.read_text()) for p in sorted((self.root / "failed").glob("*.json"))]
        return [f for f in found if not self.done(Point(**f["point"]))]

    def records(self) -> list[dict[str, t.Any]]:
        """Every point measured so far: NAME.json, or NAME.json.xz as a run committed to docs/results keeps it."""
        plain = [json.loads(p.read_text()) for p in sorted(self.points_dir.glob("*.json"))]
        packed = [json.loads(lzma.decompress(p.read_bytes())) for p in sorted(self.points_dir.glob("*.json.xz"))]
        return plain + packed


def _packed(path: Path) -> Path:
    return path.with_name(path.name + ".xz")


def _defaults() -> dict[str, t.Any]:
    """The plan's fields that have a default, at it: what a plan.json without them meant."""
    fields = dataclasses.fields(FrontierPlan)
    return {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}


def _write(path: Path, content: dict[str, t.Any]) -> None:
    """Whole or not at all: an interrupted write leaves no file that a resumed run would take for a point."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, default=str))
    os.replace(tmp, path)
