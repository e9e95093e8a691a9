"""`tidal bench gate`: the AIMD gate against a real engine under a scripted online burst.

A :class:`Trickle` keeps batch-like requests (priority 100, non-streaming) in
flight equal to a gate's target, as the claim loop would, so the gate has
something to throttle. At ``burst_at`` a burst of online requests goes straight
to vLLM at priority 0. Every scrape the gate makes is recorded with the raw
reading it saw, so the trace shows what the engine reported and what the gate
decided from it: how many scrapes it took to halve, how long to recover.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import typing as t
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tidal_workers.bench.stats import percentile
from tidal_workers.execute import failure_of
from tidal_workers.gate import AimdGate
from tidal_workers.gate import Gate
from tidal_workers.gate import MetricsError
from tidal_workers.gate import parse_metrics
from tidal_workers.policy.aimd import HALVE
from tidal_workers.policy.outage import Failure

if t.TYPE_CHECKING:
    from config import Settings

BATCH_PROMPT = "Summarise this report: " + "tide data " * 12
# Long enough that a burst filling the engine's slots also fills a small KV pool.
BURST_PROMPT = "Tell me about the sea and the moon. " * 10


@dataclasses.dataclass(frozen=True)
class GateTraceConfig:
    engine_url: str
    model: str = "tiny"
    duration: float = 40.0  # seconds of trickle, burst included
    burst_at: float = 12.0
    burst_requests: int = 32
    burst_prompt: str = BURST_PROMPT
    burst_max_tokens: int = 384
    batch_prompt: str = BATCH_PROMPT
    batch_max_tokens: int = 192


@dataclasses.dataclass
class Scrape:
    """One scrape of /metrics by the gate: the raw reading and what the gate made of it."""

    at: float  # seconds since the trace began
    target: int
    decision: str
    batch_inflight: int
    kv_usage: float | None  # raw; None when the reading failed
    kv_ewma: float | None
    waiting: float | None
    online_waiting: float | None  # raw estimate: waiting beyond our own batch items
    online_waiting_ewma: float | None
    running: float | None
    preemptions_total: float | None
    online_outstanding: int = 0  # burst requests sent and not yet finished (client side)


class _RecordingSession(requests.Session):
    """Keeps the last /metrics text the gate fetched, so the trace sees exactly what the gate saw."""

    last_text: str | None = None

    def get(self, url: str | bytes, **kwargs: t.Any) -> requests.Response:
        self.last_text = None
        resp = super().get(url, **kwargs)
        self.last_text = resp.text
        return resp


class Trickle:
    """Batch requests kept in flight up to ``gate.poll(now, inflight)``, from a thread, until closed.

    Like the claim loop, it never cancels: when the target falls, it sends
    nothing until in-flight requests drain below it. A request whose connection
    dropped is sent again once (``resent``); what still fails is in ``errors``.
    """

    def __init__(
        self,
        engine_url: str,
        model: str,
        gate: Gate,
        *,
        prompt: str = BATCH_PROMPT,
        max_tokens: int = 64,
        priority: int = 100,
        tick: float = 0.05,
        on_poll: t.Callable[[float, int, int], None] | None = None,
        max_lanes: int = 64,
    ):
        self.url = f"{engine_url}/v1/chat/completions"
        self.body = {
            "model": model,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "priority": priority,
            "messages": [{"role": "user", "content": prompt}],
        }
        self.gate = gate
        self.tick = tick
        self.on_poll = on_poll
        self.inflight = 0
        self.completed = 0
        self.errors: list[str] = []
        self.resent = 0  # requests sent again after a dropped connection
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_lanes, thread_name_prefix="trickle")
        self._session = requests.Session()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _send(self) -> None:
        try:
            resp = self._post()
            if resp.status_code != 200:
                self.errors.append(f"http {resp.status_code}: {resp.text[:200]}")
        except requests.RequestException as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self.inflight -= 1
                self.completed += 1

    def _post(self) -> requests.Response:
        """One request, sent again once if the call broke before an answer (``failure_of``: the worker's own reading
        of an engine call's exception), as a worker resends such an item: it loses nothing. A second break, a
        refusal or a timeout is an error."""
        try:
            return self._session.post(self.url, json=self.body, timeout=120)
        except requests.RequestException as exc:
            if failure_of(exc) is not Failure.BROKEN:
                raise
            with self._lock:
                self.resent += 1
            return self._session.post(self.url, json=self.body, timeout=120)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            with self._lock:
                inflight = self.inflight
            target = self.gate.poll(now, inflight)
            if self.on_poll:
                self.on_poll(now, target, inflight)
            for _ in range(target - inflight):
                with self._lock:
                    self.inflight += 1
                self._pool.submit(self._send)
            self._stop.wait(self.tick)

    def __enter__(self) -> Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)  # in-flight requests finish; nothing new is sent
        self._session.close()


@dataclasses.dataclass
class BurstRequest:
    start: float  # seconds since the trace began
    end: float
    error: str | None = None


def burst(engine_url: str, model: str, n: int, prompt: str, max_tokens: int, t0: float) -> list[BurstRequest]:
    """``n`` online requests at priority 0, all at once, straight to vLLM; returns when all are answered.

    Non-streaming on purpose: on a 2-core host the API server's per-token work
    for a few dozen streams starves its own /metrics (scrapes measured at
    1.2-2.7 s), and the gate would be tested on its fail-safe instead of on
    the engine's queue and KV, which is what this burst is meant to fill.
    """
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "priority": 0,
        "messages": [{"role": "user", "content": prompt}],
    }

    def one(session: requests.Session) -> BurstRequest:
        start = time.time() - t0
        try:
            resp = session.post(f"{engine_url}/v1/chat/completions", json=body, timeout=120)
            error = None if resp.status_code == 200 else f"http {resp.status_code}: {resp.text[:200]}"
        except requests.RequestException as exc:
            error = type(exc).__name__
        return BurstRequest(start, time.time() - t0, error)

    sessions = [requests.Session() for _ in range(n)]
    with ThreadPoolExecutor(n, thread_name_prefix="burst") as pool:
        answered = list(pool.map(one, sessions))
    for session in sessions:
        session.close()
    return answered


@dataclasses.dataclass
class GateTrace:
    config: GateTraceConfig
    scrapes: list[Scrape]
    burst_start: float  # seconds since the trace began
    burst_end: float  # when the last burst request finished
    burst: list[BurstRequest]
    batch_completed: int
    batch_errors: list[str]
    kv_high: float
    kv_low: float
    online_waiting_tolerance: float

    def pressure_seen(self) -> Scrape | None:
        """The first scrape from the burst on whose raw reading shows pressure the gate acts on."""
        previous = None
        for s in self.scrapes:
            if (
                s.at >= self.burst_start
                and s.kv_usage is not None
                and s.online_waiting is not None
                and s.preemptions_total is not None
                and (
                    s.kv_usage > self.kv_high
                    or s.online_waiting >= self.online_waiting_tolerance + 0.5
                    or (previous is not None and s.preemptions_total > previous)
                )
            ):
                return s
            if s.preemptions_total is not None:
                previous = s.preemptions_total
        return None

    def summary(self) -> dict:
        before = [s for s in self.scrapes if s.at < self.burst_start]
        pre_target = before[-1].target if before else None
        after = [s for s in self.scrapes if s.at >= self.burst_start]
        halved = next((s for s in after if s.decision == HALVE), None)
        seen = self.pressure_seen()
        recovered = next(
            (s for s in self.scrapes if s.at >= self.burst_end and pre_target is not None and s.target >= pre_target),
            None,
        )
        latencies = [b.end - b.start for b in self.burst if b.error is None]
        return {
            "scrapes": len(self.scrapes),
            "pre_burst_target": pre_target,
            "min_target_in_burst": min((s.target for s in after), default=None),
            "burst_start_s": round(self.burst_start, 3),
            "burst_end_s": round(self.burst_end, 3),
            "pressure_seen_s": seen and round(seen.at, 3),
            "first_halving_s": halved and round(halved.at, 3),
            # counting the scrape that halved: 1 = the very scrape that first saw the burst
            "scrapes_burst_start_to_halving": halved and after.index(halved) + 1,
            "scrapes_seen_to_halving": halved and seen and self.scrapes.index(halved) - self.scrapes.index(seen) + 1,
            "recovered_s": recovered and round(recovered.at, 3),
            "recovery_s_after_burst_end": recovered and round(recovered.at - self.burst_end, 3),
            "burst_latency_p50": percentile(latencies, 0.5),
            "burst_latency_max": max(latencies, default=None),
            "burst_errors": sum(1 for b in self.burst if b.error),
            "batch_completed": self.batch_completed,
            "batch_errors": len(self.batch_errors),
        }


def run(cfg: GateTraceConfig, settings: Settings) -> GateTrace:
    """Trickle under an :class:`AimdGate` on ``cfg.engine_url`` for ``cfg.duration`` s, burst at ``cfg.burst_at``."""
    session = _RecordingSession()
    gate = AimdGate(settings.replace(vllm_url=cfg.engine_url), session=session)
    scrapes: list[Scrape] = []
    fired: list[BurstRequest] = []
    t0 = time.time()
    last_state = gate.state

    def record(now: float, target: int, inflight: int) -> None:
        nonlocal last_state
        if gate.state is last_state:  # no scrape on this poll
            return
        last_state = st = gate.state
        try:
            obs = parse_metrics(session.last_text or "", now, gate.stale_seconds, inflight)
        except MetricsError:
            obs = None
        scrapes.append(
            Scrape(
                at=now - t0,
                target=target,
                decision=st.decision,
                batch_inflight=inflight,
                kv_usage=obs.kv_usage if obs else None,
                kv_ewma=st.kv_ewma,
                waiting=obs.waiting if obs else None,
                online_waiting=obs.online_waiting if obs else None,
                online_waiting_ewma=st.waiting_ewma,
                running=obs.running if obs else None,
                preemptions_total=obs.preemptions_total if obs else None,
            )
        )

    burster = threading.Timer(
        cfg.burst_at,
        lambda: fired.extend(
            burst(cfg.engine_url, cfg.model, cfg.burst_requests, cfg.burst_prompt, cfg.burst_max_tokens, t0)
        ),
    )
    with Trickle(
        cfg.engine_url, cfg.model, gate, prompt=cfg.batch_prompt, max_tokens=cfg.batch_max_tokens, on_poll=record
    ) as trickle:
        burster.start()
        time.sleep(max(0.0, t0 + cfg.duration - time.time()))
        burster.join()
    burst_start = min((b.start for b in fired), default=cfg.burst_at)
    for s in scrapes:
        s.online_outstanding = sum(1 for b in fired if b.start <= s.at < b.end)
    return GateTrace(
        config=cfg,
        scrapes=scrapes,
        burst_start=burst_start,
        burst_end=max((b.end for b in fired), default=burst_start),
        burst=fired,
        batch_completed=trickle.completed,
        batch_errors=trickle.errors,
        kv_high=settings.kv_high,
        kv_low=settings.kv_low,
        online_waiting_tolerance=settings.online_waiting_tolerance,
    )


def results(trace: GateTrace) -> dict:
    """What ``gate.json`` holds beside the provenance: the configuration, the summary and every scrape."""
    return {
        "config": dataclasses.asdict(trace.config),
        "summary": trace.summary(),
        "scrapes": [dataclasses.asdict(s) for s in trace.scrapes],
    }


def plot(trace: GateTrace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s.at for s in trace.scrapes]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.step(xs, [s.target for s in trace.scrapes], where="post", label="gate target", linewidth=2)
    top.plot(xs, [s.batch_inflight for s in trace.scrapes], ".", label="batch in flight")
    top.set_ylabel("batch requests")
    top.set_title("AIMD gate under an online burst (one point per scrape)")
    load = top.twinx()
    load.plot(xs, [s.online_outstanding for s in trace.scrapes], color="tab:red", label="online outstanding")
    load.plot(
        xs,
        [s.online_waiting if s.online_waiting is not None else float("nan") for s in trace.scrapes],
        "--",
        color="tab:purple",
        label="online waiting (engine)",
    )
    load.set_ylabel("online requests")
    handles = top.get_legend_handles_labels()[0] + load.get_legend_handles_labels()[0]
    top.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize=8)

    nan = float("nan")
    bottom.plot(xs, [s.kv_usage if s.kv_usage is not None else nan for s in trace.scrapes], label="KV usage (raw)")
    bottom.plot(xs, [s.kv_ewma if s.kv_ewma is not None else nan for s in trace.scrapes], label="KV usage (EWMA)")
    bottom.axhline(trace.kv_high, color="grey", linestyle=":", label=f"kv_high {trace.kv_high:g}")
    bottom.axhline(trace.kv_low, color="grey", linestyle="--", label=f"kv_low {trace.kv_low:g}")
    bottom.set_ylim(0, 1.05)
    bottom.set_ylabel("KV cache usage")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper right", fontsize=8)
    for ax in (top, bottom):
        ax.axvspan(trace.burst_start, trace.burst_end, color="tab:red", alpha=0.08)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
