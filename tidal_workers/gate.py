"""The admission gate: how many batch requests this node may have at the engine right now.

The claim loop calls ``gate.poll(now, outstanding)`` each pass with O, the node's
requests at the engine, and hands the target to the LeaseBook, whose engine
tokens the tasks wait for; it claims up to the target plus a small prefetch. :class:`AimdGate` is the I/O edge of the pure rule in
:mod:`tidal_workers.policy.aimd`: once per period it scrapes the ``/metrics``
pages its signal map names (the co-located vLLM's by default; a prefill and a
decode pool's, or Dynamo's, under ``TIDAL_GATE_SIGNALS``: :mod:`tidal_workers.signals`),
turns them into an :class:`Observation` and steps the controller. Anything it cannot trust (no answer within half a period, an HTTP
error, text that does not parse, a missing series, samples stamped older than
``metrics_stale_seconds``) is a failed observation, which closes the gate.

The same scrape tells the claims of split items (``Gate.prefill_slack``) whether the engine has prefill slack: the prompt
tokens it prefilled per engine step over the last period (``vllm:prompt_tokens_total`` over
``vllm:iteration_tokens_total``'s count).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
import typing as t

import prometheus_client
import requests

from tidal_engine.twin import load_profile
from tidal_workers.leases import LeaseBook
from tidal_workers.own_requests import OWN
from tidal_workers.own_requests import Finished
from tidal_workers.policy.aimd import DECISIONS
from tidal_workers.policy.aimd import FAILSAFE
from tidal_workers.policy.aimd import UNKNOWN_ENGINE_CEILING
from tidal_workers.policy.aimd import AimdConfig
from tidal_workers.policy.aimd import AimdController
from tidal_workers.policy.aimd import AimdState
from tidal_workers.policy.aimd import Observation
from tidal_workers.policy.aimd import engine_ceiling
from tidal_workers.policy.phase import SplitConfig
from tidal_workers.policy.phase import has_prefill_slack
from tidal_workers.policy.profile_reference import Batch
from tidal_workers.policy.profile_reference import Work
from tidal_workers.scrape import fetch
from tidal_workers.scrape import samples
from tidal_workers.scrape import totals
from tidal_workers.signals import ENGINE
from tidal_workers.signals import MAPS
from tidal_workers.signals import VLLM
from tidal_workers.signals import SignalMap
from tidal_workers.signals import combine

if t.TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)

CACHE_CONFIG = "vllm:cache_config_info"
PROMPT_TOKENS, STEPS = "vllm:prompt_tokens_total", "vllm:iteration_tokens_total_count"
ITL_SUM, ITL_COUNT = "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count"
# Requests finished, with their prompt and generated tokens (both histograms are observed as a request finishes),
# and requests given their first token (observed as it comes): the online load, finished and arriving.
FINISHED = ("vllm:request_prompt_tokens_count", "vllm:request_prompt_tokens_sum", "vllm:request_generation_tokens_sum")
FIRST_TOKENS = "vllm:time_to_first_token_seconds_count"

TARGET = prometheus_client.Gauge(
    "tidal_gate_target", "The gate's target: the most batch requests this node keeps at its engine."
)
CEILING = prometheus_client.Gauge(
    "tidal_gate_ceiling", "The gate's ceiling: TIDAL_MAX_INFLIGHT, or what the engine allows beside its online peak."
)
KV_EWMA = prometheus_client.Gauge("tidal_gate_kv_ewma", "Smoothed KV cache usage of the co-located vLLM (0..1).")
WAITING_EWMA = prometheus_client.Gauge("tidal_gate_waiting_ewma", "Smoothed count of online requests waiting in vLLM.")
ALPHA_SET = prometheus_client.Gauge(
    "tidal_gate_alpha_set", "Latency gate: the budget multiplier, online ITL allowed over its online-alone reference."
)
REFERENCE_ITL = prometheus_client.Gauge(
    "tidal_gate_reference_itl_seconds",
    "Latency gate: the engine's online-alone inter-token latency (given, the profile's, or fitted).",
)
ONLINE_RATE = prometheus_client.Gauge(
    "tidal_gate_online_requests_per_second",
    "Latency gate with a profile: the online requests a second its profile is priced at (the engine's first tokens "
    "less this node's sends, over ~100 s, started again on a rise; its finished requests' where none are read).",
)
STEERED = prometheus_client.Gauge(
    "tidal_gate_steered_inflation",
    "Latency gate: the inflation its target last moved on (with a profile, the profile's at the working set).",
)
PROFILE_LEVEL = prometheus_client.Gauge(
    "tidal_gate_profile_level", "Latency gate with a profile: the engine's inter-token latency over the profile's."
)
INFLATION = prometheus_client.Gauge(
    "tidal_gate_inflation", "Latency gate: the engine's inter-token latency over its reference, smoothed."
)
WORKING_SET = prometheus_client.Gauge(
    "tidal_gate_working_set", "Batch requests this node has at its engine (POSTs sent, not answered) at the last step."
)
DECIDED = prometheus_client.Counter("tidal_gate_decisions", "AIMD controller steps by decision.", ["decision"])
for _decision in DECISIONS:
    DECIDED.labels(_decision)  # export every series from the start, at 0


class Gate(t.Protocol):
    def poll(self, now: float, inflight: int) -> int:
        """The target for the node's batch requests at the engine, given ``inflight`` (O) of them there now."""
        ...

    def prefill_slack(self, cfg: SplitConfig) -> bool:
        """Whether the engine has room for split items' prefills (few prompt tokens per step)."""
        ...


class FixedGate:
    """A constant in-flight target (``gate_mode = fixed``)."""

    def __init__(self, target: int):
        self.target = target
        TARGET.set(target)
        CEILING.set(target)

    def poll(self, now: float, inflight: int) -> int:
        return self.target

    def prefill_slack(self, cfg: SplitConfig) -> bool:
        """Always: a fixed gate reads no engine, and its target is the room the operator gives batch work."""
        return True


class MetricsError(Exception):
    """The scrape cannot be trusted; the message says why."""


def parse_metrics(
    text: str, now: float, stale_seconds: float, batch_inflight: int, mapping: SignalMap = VLLM
) -> Observation:
    """One good Observation from a single vLLM's exposition text (the ``engine`` page), or MetricsError."""
    return parse_pages({ENGINE: text}, now, stale_seconds, batch_inflight, mapping)


def parse_pages(
    pages: t.Mapping[str, str], now: float, stale_seconds: float, batch_inflight: int, mapping: SignalMap = VLLM
) -> Observation:
    """One good Observation from the exposition text of each source ``mapping`` reads, or MetricsError.

    Counts are summed over label sets (every engine and model a page carries shares the node); KV usage is a
    fraction, so the fullest is taken. vLLM's own exposition carries no timestamps; a cache or federation in
    between may, and then a stamp older than ``stale_seconds`` fails it.
    """
    wanted = {name for sig in mapping.signals().values() for name in sig.names}
    values = {source: _page_values(source, pages.get(source, ""), wanted, now, stale_seconds) for source in pages}
    read: dict[str, float] = {}
    missing: list[str] = []
    for name, signal in mapping.signals().items():
        value, lacking = combine(signal, values)
        missing += lacking
        if value is not None:
            read[name] = value
    if missing:
        raise MetricsError(f"/metrics lacks {', '.join(missing)}")
    return Observation(
        kv_usage=read["kv_usage"],
        waiting=read["waiting"],
        running=read["running"],
        preemptions_total=read["preemptions"],
        batch_inflight=batch_inflight,
    )


def _page_values(source: str, text: str, wanted: set[str], now: float, stale_seconds: float) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    try:
        for sample in samples(text):
            if sample.name not in wanted:
                continue
            if not math.isfinite(sample.value):
                raise MetricsError(f"{sample.name} on {source} is {sample.value}")
            if sample.timestamp is not None and now - float(sample.timestamp) > stale_seconds:
                raise MetricsError(f"{sample.name} on {source} is stale ({now - float(sample.timestamp):.1f} s old)")
            values.setdefault(sample.name, []).append(float(sample.value))
    except MetricsError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on text that is not an exposition
        raise MetricsError(f"unparseable /metrics on {source}: {exc}") from exc
    return values


Counters = tuple[float, ...]


def counter_values(text: str, names: tuple[str, ...]) -> Counters | None:
    """Counters' values since the engine started, in the order of ``names``, or None where the page lacks one."""
    try:
        read = totals(text, names)
    except Exception:  # text that is not an exposition: parse_metrics says why
        return None
    return tuple(read[name] for name in names) if len(read) == len(names) else None


def step_counters(text: str) -> Counters | None:
    """(prompt tokens prefilled, engine steps) since the engine started."""
    return counter_values(text, (PROMPT_TOKENS, STEPS))


def itl_counters(text: str) -> Counters | None:
    """(seconds between tokens, tokens timed) of vLLM's inter-token latency histogram since the engine started."""
    return counter_values(text, (ITL_SUM, ITL_COUNT))


def load_counters(text: str) -> Counters | None:
    """(requests finished, their prompt tokens, their generated tokens, requests given a first token) since the
    engine started."""
    return counter_values(text, (*FINISHED, FIRST_TOKENS))


def _deltas(before: Counters | None, after: Counters | None) -> Counters | None:
    """The counters' increments; None without two readings, or across a restart (a counter fell)."""
    if before is None or after is None or any(a < b for a, b in zip(after, before, strict=True)):
        return None
    return tuple(a - b for a, b in zip(after, before, strict=True))


def prefill_per_step(before: Counters | None, after: Counters | None) -> float | None:
    """Prompt tokens per engine step between two readings of ``step_counters``; 0 if the engine took no step (it
    is idle); None without two readings, or across a restart."""
    d = _deltas(before, after)
    return None if d is None else d[0] / d[1] if d[1] else 0.0


def mean_itl(before: Counters | None, after: Counters | None) -> float | None:
    """Mean inter-token latency in seconds between two readings of ``itl_counters``; None if no token was timed."""
    d = _deltas(before, after)
    return d[0] / d[1] if d is not None and d[1] else None


def online_load(
    engine_before: Counters, engine: Counters, own_before: Finished, own: Finished, seconds: float
) -> tuple[Work, float] | None:
    """The requests the engine finished over ``seconds`` that were not this node's, with their prompt and generated
    tokens, and the requests not this node's that it gave a first token (``load_counters``); None across an engine
    restart. A period may read a few of this node's requests short or over (its count follows the engine's by an
    answer's way back, or leads it by a first token's): the profile's sums over periods even that out."""
    d = _deltas(engine_before, engine)
    if d is None:
        return None
    finished = Work(
        seconds,
        d[0] - (own.requests - own_before.requests),
        d[1] - (own.prompt_tokens - own_before.prompt_tokens),
        d[2] - (own.output_tokens - own_before.output_tokens),
    )
    # not clipped at 0: a period that counts this node's sends before the engine's first tokens reads fewer, the next
    # more, and the sums even that out (clipped, the slips of ~4 sends a second read 1/s as 1.6/s on the twin)
    return finished, d[3] - (own.sent - own_before.sent)


def batch_work(before: Finished, own: Finished, inflight: int, seconds: float, stage_tokens: int) -> Batch:
    """This node's batch at the engine for the profile: ``inflight`` requests decoding at its items' mean context
    (prompt and half the output, over all it finished), the prompt tokens it had computed a second, in chunks of
    ``stage_tokens`` where staged, else of its items' mean computed prompt. Staged, the prompts at or under
    ``TIDAL_PREFILL_STAGE_MIN_TOKENS`` land whole and are priced as chunks all the same (each at most two chunks'
    worth at the default floor and chunk: a price a little low where most prompts are short)."""
    items = max(own.items, 1)
    context = (own.item_prompt_tokens + own.item_output_tokens / 2) / items
    chunk = stage_tokens or (own.computed_tokens / items)
    return Batch(inflight, context, (own.computed_tokens - before.computed_tokens) / seconds, chunk)


def kv_capacity_tokens(text: str) -> int | None:
    """Tokens the engine's KV cache holds (``num_gpu_blocks × block_size`` of ``vllm:cache_config_info``; the
    smallest engine's), or None where the page does not say (an older vLLM, blocks not yet allocated)."""
    sizes = []
    try:
        for sample in samples(text):
            if sample.name == CACHE_CONFIG:
                blocks, size = sample.labels.get("num_gpu_blocks", ""), sample.labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit():
                    sizes.append(int(blocks) * int(size))
    except Exception:  # text that is not an exposition: parse_metrics says why
        return None
    return min(sizes) if sizes else None


def configured_ceiling(settings: Settings, kv_tokens: int | None = None) -> int:
    """The gate's ceiling: ``TIDAL_MAX_INFLIGHT`` if set, else what the engine allows beside its online peak."""
    if settings.max_inflight:
        return settings.max_inflight
    allowed = engine_ceiling(settings.max_num_seqs, kv_tokens, settings.batch_request_tokens, settings.online_headroom)
    return allowed or UNKNOWN_ENGINE_CEILING


#: Pool threads for the ceiling when the engine's slots are not configured: its KV capacity, read after the pool
#: is built, may allow more than the fallback ceiling, up to about this many.
UNKNOWN_SLOTS_POOL = 64


def pool_threads(settings: Settings) -> int:
    """A GPU node worker's pool size: ``TIDAL_WORKER_THREADS``, else room for the ceiling known at start (with the
    slots known, the KV bound read later can only lower it), the prefetch, and two spare."""
    if settings.worker_threads:
        return settings.worker_threads
    known = settings.max_inflight or settings.max_num_seqs
    ceiling = configured_ceiling(settings) if known else UNKNOWN_SLOTS_POOL
    return ceiling + settings.dispatch_prefetch + 2


class AimdGate:
    """The target for requests at the engine, set by the AIMD rule from the co-located vLLM's /metrics."""

    def __init__(self, settings: Settings, session: requests.Session | None = None):
        self.settings = settings
        self.mapping = MAPS[settings.gate_signals]
        named = {ENGINE: settings.vllm_url.rstrip("/") + "/metrics", **settings.gate_metrics_url_map}
        self.urls = {source: named[source] for source in self.mapping.sources()}  # Settings checked they exist
        self.period = settings.scrape_seconds
        self.stale_seconds = settings.metrics_stale_seconds
        self.session = session or requests.Session()
        # the latency gate's reference from the engine's profile: a name not in twin_profiles.toml fails the start
        use_profile = settings.gate_mode == "latency" and settings.gate_profile and not settings.gate_reference_itl_ms
        self.profile = load_profile(settings.gate_profile) if use_profile else None
        self.controller = AimdController(AimdConfig.from_settings(settings, configured_ceiling(settings), self.profile))
        self.state = self.controller.initial()
        self._scraped_at: float | None = None
        self._kv_seen = bool(settings.max_inflight)  # an override needs nothing from the engine
        self._counters: Counters | None = None  # the engine's step_counters at the last scrape
        self._itl: Counters | None = None  # and its itl_counters
        self._finished: tuple[float, Counters, Finished] | None = None  # when, load_counters, this node's own
        self.prefill_tokens_per_step: float | None = None  # over the last period; None: not known
        TARGET.set(self.state.target)
        CEILING.set(self.controller.config.max_target)
        ALPHA_SET.set(self.controller.config.alpha_set or math.nan)

    def poll(self, now: float, inflight: int) -> int:
        if self._scraped_at is not None and 0 <= now - self._scraped_at < self.period:
            return self.state.target
        self._scraped_at = now
        try:
            pages = {source: self._scrape(url) for source, url in self.urls.items()}
            obs = parse_pages(pages, now, self.stale_seconds, inflight, self.mapping)
            why = ""
            if not self._kv_seen and ENGINE in pages:  # the ceiling follows the co-located engine's KV pool
                self._size(pages[ENGINE])
            counters = step_counters(pages[ENGINE]) if ENGINE in pages else None
            itl = itl_counters(pages[ENGINE]) if ENGINE in pages else None
            obs = dataclasses.replace(obs, itl_seconds=mean_itl(self._itl, itl))
            if self.profile is not None:
                obs = self._with_work(obs, load_counters(pages.get(ENGINE, "")), now)
        except MetricsError as exc:
            obs, why, counters, itl = Observation.failed(inflight), str(exc), None, None
            self._finished = None
        self.prefill_tokens_per_step = prefill_per_step(self._counters, counters)
        self._counters, self._itl = counters, itl
        before = self.state
        self.state = self.controller.step(before, obs, now)
        self._export(before, obs, why)
        return self.state.target

    def prefill_slack(self, cfg: SplitConfig) -> bool:
        """The last period's prompt tokens per step under the share of τ ``cfg`` allows; not without a reading."""
        per_step = self.prefill_tokens_per_step
        return per_step is not None and has_prefill_slack(per_step, cfg.max_prompt_tokens, cfg)

    def _with_work(self, obs: Observation, engine: Counters | None, now: float) -> Observation:
        """The period's online load (the engine's finished and first-token requests less this node's) and this
        node's batch work, for the profile's reference; the observation as it was without two readings."""
        own, before = OWN.totals(), self._finished
        self._finished = None if engine is None else (now, engine, own)
        if before is None or engine is None or now <= before[0]:
            return obs
        seconds = now - before[0]
        finished, arrived = online_load(before[1], engine, before[2], own, seconds) or (None, None)
        stage = self.settings.prefill_stage_tokens
        batch = batch_work(before[2], own, obs.batch_inflight, seconds, stage)
        return dataclasses.replace(obs, online_finished=finished, online_arrived=arrived, batch=batch)

    def _size(self, text: str) -> None:
        """Once the engine shows its KV capacity: the ceiling it allows (the target is clamped under it)."""
        kv = kv_capacity_tokens(text)
        if kv is None:
            return
        self._kv_seen = True
        ceiling = configured_ceiling(self.settings, kv)
        if ceiling != self.controller.config.max_target:
            log.info("gate ceiling %d (engine: %d KV tokens, %d slots)", ceiling, kv, self.settings.max_num_seqs)
            self.controller = AimdController(AimdConfig.from_settings(self.settings, ceiling, self.profile))
            self.state = dataclasses.replace(self.state, target=min(self.state.target, ceiling))
            CEILING.set(ceiling)

    def _scrape(self, url: str) -> str:
        try:
            return fetch(url, self.period / 2, self.session)
        except requests.Timeout as exc:
            raise MetricsError(f"{url} did not answer within {self.period / 2:g} s") from exc
        except requests.HTTPError as exc:
            raise MetricsError(str(exc)) from exc
        except requests.RequestException as exc:
            raise MetricsError(f"{url} unreachable: {exc.__class__.__name__}") from exc

    def _export(self, before: AimdState, obs: Observation, why: str) -> None:
        """Metrics every step; a log line per change of target, and one when failures begin."""
        st = self.state
        DECIDED.labels(st.decision).inc()
        TARGET.set(st.target)
        KV_EWMA.set(st.kv_ewma if st.kv_ewma is not None else math.nan)
        WAITING_EWMA.set(st.waiting_ewma if st.waiting_ewma is not None else math.nan)
        WORKING_SET.set(obs.batch_inflight)
        REFERENCE_ITL.set(st.reference_s if st.reference_s is not None else math.nan)
        INFLATION.set(st.inflation if st.inflation is not None else math.nan)
        STEERED.set(st.steered if st.steered is not None else math.nan)
        if self.profile is not None:
            ONLINE_RATE.set(st.profiled.rate)
            PROFILE_LEVEL.set(st.profiled.level if st.profiled.level is not None else math.nan)
        if why:
            if st.target != before.target or before.decision != FAILSAFE:
                log.warning("gate target %d -> %d (failsafe: %s)", before.target, st.target, why)
        elif st.target != before.target:
            log.info(
                "gate target %d -> %d (%s: kv_ewma=%.3f online_waiting_ewma=%.2f preemptions=%g inflight=%d%s)",
                before.target,
                st.target,
                st.decision,
                st.kv_ewma,
                st.waiting_ewma,
                obs.preemptions_total,
                obs.batch_inflight,
                "" if st.inflation is None else f" inflation={st.inflation:.3f} reference_s={st.reference_s:.4f}",
            )


class SteppedGate:
    """An AimdGate stepped on a thread of its own, so a slow or hanging scrape never holds up the claim loop:
    ``poll`` answers the last target at once. A change of target wakes the claim loop and the waiting tasks."""

    def __init__(self, gate: AimdGate, book: LeaseBook):
        self.gate, self.book = gate, book

    def poll(self, now: float, inflight: int) -> int:
        return self.gate.state.target

    def prefill_slack(self, cfg: SplitConfig) -> bool:
        return self.gate.prefill_slack(cfg)

    def runner(self, stopping: threading.Event) -> t.Callable[[], None]:
        def run() -> None:
            while not stopping.is_set():
                before = self.gate.state.target
                try:
                    target = self.gate.poll(time.time(), self.book.outstanding())
                except Exception:  # a bug in a step must not stop the scrapes: the target stays where it was
                    log.exception("gate step failed")
                    target = before
                if target != before:
                    self.book.set_target(target)
                    self.book.released.set()
                stopping.wait(self.gate.period)

        return run


def make_gate(settings: Settings, session: requests.Session | None = None) -> Gate:
    """The gate ``TIDAL_GATE_MODE`` names (Settings admits only ``aimd`` and ``fixed``)."""
    if settings.gate_mode == "fixed":
        return FixedGate(configured_ceiling(settings))
    return AimdGate(settings, session)
