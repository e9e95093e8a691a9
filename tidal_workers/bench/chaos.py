"""`tidal bench chaos`: the whole stack under random faults, then proof that no line was lost, doubled or failed.

A private Redis and PostgreSQL (``services``), the API (`tidal serve`), two GPU nodes (`tidal worker`, each with its
own engine), the ops worker and beat run as the processes production runs. Several tenants submit batches through the
API while online requests reach each engine directly at priority 0. A fault comes every ``interval`` seconds, its
kind drawn from a shuffled bag of every kind (so each recurs): kill -9 of a worker, beat or the API (restarted at
once, as a supervisor would), an engine killed and restarted after ``engine_down`` seconds, Redis restarted without
persistence, PostgreSQL restarted, Redis paused (SIGSTOP, a network stall) for ``stall`` seconds. Then the load stops
and every batch must finish: every batch completed, every input line exactly once in its output file, no error line.
The report gives each fault with its recovery time (injection to the next completed item once the part is back).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import typing as t
from collections import Counter
from pathlib import Path

import requests
from sqlalchemy import func
from sqlalchemy import select

from config import Settings
from config.settings import child_environ
from config.settings import env_name
from tidal_api.cli.services import PrivatePostgres
from tidal_api.cli.services import PrivateRedis
from tidal_api.cli.services import kill_group
from tidal_api.cli.services import until
from tidal_engine.serve import Engine
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import die_with_parent
from tidal_engine.serve import free_port
from tidal_engine.serve import start_engine
from tidal_workers.runtime import Runtime
from tidal_workers.store import Item
from tidal_workers.store import ItemStatus

KINDS = ("kill_worker", "kill_beat", "kill_api", "engine", "redis_restart", "postgres_restart", "redis_stall")
NODES = ("a", "b")
TERMINAL = ("completed", "failed", "expired", "cancelled")
CHAT = "/v1/chat/completions"


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    minutes: float
    seed: int
    interval: tuple[float, float] = (30.0, 90.0)  # seconds between faults
    engine_down: tuple[float, float] = (10.0, 240.0)  # an engine stays down this long before its restart begins
    stall: tuple[float, float] = (5.0, 30.0)  # Redis paused this long
    tenants: int = 3
    batch_every: float = 20.0  # each tenant submits a batch this often
    batch_lines: tuple[int, int] = (8, 24)
    max_tokens: int = 8
    online_rate: float = 0.2  # online requests per second to each engine
    drain_minutes: float = 10.0  # after the chaos window: the time every batch has to finish
    engine: str = "twin"  # twin: real vLLM with a GPU's step times (``profile``); tiny: the CPU engine
    profile: str = ""
    max_num_seqs: int = 8  # each engine's slots: two engines and the stack share this machine


@dataclasses.dataclass(frozen=True)
class Fault:
    at: float  # seconds into the chaos window
    kind: str
    target: str
    hold: float = 0.0  # engine: seconds down before the restart begins; redis_stall: seconds paused


def schedule(cfg: ChaosConfig) -> list[Fault]:
    """The faults of a run, from its seed alone: the same seed gives the same schedule."""
    rng = random.Random(cfg.seed)
    faults: list[Fault] = []
    bag: list[str] = []
    at = rng.uniform(*cfg.interval)
    while at < cfg.minutes * 60:
        if not bag:
            bag = list(KINDS)
            rng.shuffle(bag)
        kind = bag.pop()
        if kind == "kill_worker":
            faults.append(Fault(round(at, 1), kind, rng.choice([*(f"worker-{n}" for n in NODES), "ops"])))
        elif kind == "engine":
            faults.append(
                Fault(round(at, 1), kind, f"engine-{rng.choice(NODES)}", round(rng.uniform(*cfg.engine_down)))
            )
        elif kind == "redis_stall":
            faults.append(Fault(round(at, 1), kind, "redis", round(rng.uniform(*cfg.stall), 1)))
        else:
            target = {"kill_beat": "beat", "kill_api": "api", "redis_restart": "redis", "postgres_restart": "postgres"}
            faults.append(Fault(round(at, 1), kind, target[kind]))
        at += rng.uniform(*cfg.interval)
    return faults


class Child:
    """One `tidal ...` process of the stack, in its own session (kill -9 takes all it forked), restartable."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    def kill9(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)


class EngineSlot:
    """One node's engine on a fixed port (its worker keeps the URL across restarts), with its CPU time."""

    def __init__(self, name: str, options: EngineOptions, log_dir: Path):
        self.name, self.options, self.log_dir = name, options, log_dir
        self.url = f"http://{options.host}:{options.port}"
        self.engine: Engine | None = None
        self.starts: list[float] = []
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds last seen, over every process of every start
        self.down = threading.Event()

    def start(self) -> None:
        log = self.log_dir / f"{self.name}-{len(self.starts)}.log"
        self.engine = start_engine(self.options, log_path=log, timeout_s=600)
        self.starts.append(self.engine.started_s)
        self.down.clear()

    def kill9(self) -> None:
        self.sample_cpu()
        self.down.set()
        if self.engine is not None:
            kill_group(self.engine.process)

    def sample_cpu(self) -> None:
        if self.engine is not None:
            self.cpu.update(group_cpu(self.engine.process.pid))

    def stop(self) -> None:
        self.sample_cpu()
        if self.engine is not None:
            self.engine.stop()


def group_cpu(pgid: int) -> dict[int, float]:
    """CPU seconds (user + system) of every live process in a process group, from /proc."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            found[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


@dataclasses.dataclass
class Submitted:
    tenant: str
    batch_id: str
    custom_ids: list[str]


class Stack:
    """The private stack: services, engines, processes, and a Runtime on the same store to read progress."""

    def __init__(self, cfg: ChaosConfig, base: Settings, out: Path):
        self.cfg, self.out = cfg, out
        self.log_dir = out / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (out / "redis").mkdir(exist_ok=True)
        self.redis = PrivateRedis(out / "redis")
        self.pg = PrivatePostgres()
        self.keys = {f"tenant{i}": "sk-chaos-" + secrets.token_hex(20) for i in range(cfg.tenants)}
        self.api_url = f"http://127.0.0.1:{free_port()}"
        self.settings = base.replace(
            home=str(out / "home"),
            database_url=self.pg.url,
            blob_dir="",
            redis_url=self.redis.url,
            broker_url="",
            env="prod",
            api_keys=",".join(f"{tenant}:{key}" for tenant, key in self.keys.items()),
            bind=self.api_url.removeprefix("http://"),
            api_workers=1,
            # A fixed in-flight target: two CPU engines and the whole stack share this machine's cores, where the AIMD
            # gate's /metrics scrapes (half a second to answer) time out and close it; the soak tests recovery.
            gate_mode="fixed",
            max_inflight=4,
        )
        self.rt = Runtime(self.settings)
        self.engines = {node: self._engine_slot(node, base) for node in NODES}
        tidal = [sys.executable, "-m", "tidal_api.cli"]
        self.children = {
            "api": self._child("api", [*tidal, "serve"]),
            "ops": self._child("ops", [*tidal, "worker", "--ops"], node="ops", ops_metrics_port=str(free_port())),
            "beat": self._child("beat", [*tidal, "beat"]),
            **{
                f"worker-{n}": self._child(
                    f"worker-{n}",
                    [*tidal, "worker"],
                    node=f"chaos-{n}",
                    vllm_url=self.engines[n].url,
                    worker_metrics_port=str(free_port()),
                )
                for n in NODES
            },
        }

    def _engine_slot(self, node: str, base: Settings) -> EngineSlot:
        """Node ``node``'s engine on a port of its own that it keeps across restarts."""
        if self.cfg.engine == "twin":
            from tidal_engine.serve import twin_options

            options = twin_options(
                base,
                self.cfg.profile,
                max_num_seqs=self.cfg.max_num_seqs,
                max_model_len=1024,
                port=free_port(),
                trace_path=self.log_dir / f"engine-{node}.steps.csv",  # every twin writes its step trace
            )
        else:
            from tidal_engine.tiny import build_tiny

            options = EngineOptions(
                model=str(build_tiny(base.home)),
                served_model_name="tiny",
                port=free_port(),
                kv_cache_bytes="16M",
                max_model_len=1024,
                max_num_seqs=self.cfg.max_num_seqs,
            )
        return EngineSlot(f"engine-{node}", options, self.log_dir)

    @property
    def model(self) -> str:
        """The name clients send: the engines' served name."""
        options = self.engines[NODES[0]].options
        return options.served_model_name or options.model

    def _env(self, **overrides: str) -> dict[str, str]:
        env = {env_name(f.name): str(getattr(self.settings, f.name)) for f in dataclasses.fields(self.settings)}
        env.update({env_name(k): v for k, v in overrides.items()})
        for k, v in list(env.items()):
            if v in ("True", "False"):
                env[k] = v.lower()
        return child_environ(**env)

    def _child(self, name: str, argv: list[str], **overrides: str) -> Child:
        return Child(name, argv, self._env(**overrides), self.log_dir)

    def start(self) -> None:
        threads = [threading.Thread(target=slot.start) for slot in self.engines.values()]
        for th in threads:
            th.start()
        done = subprocess.run(
            [sys.executable, "-m", "tidal_api.cli", "db", "upgrade"], env=self._env(), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"tidal db upgrade failed: {done.stderr[-2000:]}")
        for child in self.children.values():
            child.start()
        until(lambda: _answers(self.api_url + "/openapi.json"), 120, "the API", every=0.2)
        for th in threads:
            th.join()
        if any(slot.engine is None for slot in self.engines.values()):
            raise RuntimeError(f"an engine did not start; see {self.log_dir}")

    def completed(self) -> int | None:
        """Items completed so far (SQL), or None while the store does not answer."""
        try:
            with self.rt.store.read() as s:
                return int(
                    s.scalar(select(func.count()).select_from(Item).where(Item.status == ItemStatus.completed.value))
                    or 0
                )
        except Exception:  # PostgreSQL restarting: this sample is missing, not zero
            return None

    def close(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop()
        for slot in self.engines.values():
            slot.stop()
        self.rt.close()
        self.redis.stop()
        self.pg.stop()


class Load:
    """Each tenant's batches through the API (retried through any fault), and online requests to each engine."""

    def __init__(self, stack: Stack, cfg: ChaosConfig):
        self.stack, self.cfg = stack, cfg
        self.stop = threading.Event()
        self.submitted: list[Submitted] = []
        self.online: dict[str, Counter[str]] = {node: Counter() for node in NODES}
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._tenant, args=(tenant, key, cfg.seed * 1000 + i), daemon=True)
            for i, (tenant, key) in enumerate(stack.keys.items())
        ] + [threading.Thread(target=self._online, args=(node,), daemon=True) for node in NODES]

    def start(self) -> None:
        for th in self.threads:
            th.start()

    def finish(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(120)

    def _retry(self, call: t.Callable[[], requests.Response], ok: t.Callable[[requests.Response], bool]) -> dict:
        """The call until it answers ``ok`` (the API restarts, Redis pauses, PostgreSQL restarts): its JSON."""
        deadline = time.monotonic() + 60 * (self.cfg.minutes + self.cfg.drain_minutes)
        while time.monotonic() < deadline:
            try:
                r = call()
                if ok(r):
                    return dict(r.json())
                if 400 <= r.status_code < 500 and r.status_code not in (408, 409, 429):
                    raise RuntimeError(f"the API refused a valid request: {r.status_code} {r.text[:300]}")
            except requests.RequestException:
                pass
            time.sleep(1.0)
        raise TimeoutError("the API did not accept a request before the run ended")

    def _tenant(self, tenant: str, key: str, seed: int) -> None:
        rng = random.Random(seed)
        auth = {"Authorization": f"Bearer {key}"}
        url = self.stack.api_url
        for k in itertools.count():
            if self.stop.is_set():
                return
            ids = [f"{tenant}-{k}-{i}" for i in range(rng.randint(*self.cfg.batch_lines))]
            lines = [
                {
                    "custom_id": cid,
                    "method": "POST",
                    "url": CHAT,
                    "body": {
                        "model": self.stack.model,
                        "messages": [{"role": "user", "content": f"{cid} {rng.random():.6f}"}],
                        "max_tokens": self.cfg.max_tokens,
                    },
                }
                for cid in ids
            ]
            data = "".join(json.dumps(line) + "\n" for line in lines).encode()
            upload = self._retry(
                functools.partial(
                    requests.post,
                    url + "/v1/files",
                    headers=auth,
                    data={"purpose": "batch"},
                    files={"file": ("in.jsonl", data)},
                    timeout=30,
                ),
                lambda r: r.status_code == 200,
            )
            body = {"input_file_id": upload["id"], "endpoint": CHAT, "completion_window": "24h"}
            headers = {**auth, "Idempotency-Key": f"chaos-{tenant}-{k}"}  # a retried create makes one batch
            batch = self._retry(
                functools.partial(requests.post, url + "/v1/batches", headers=headers, json=body, timeout=30),
                lambda r: r.status_code == 200,
            )
            with self.lock:
                self.submitted.append(Submitted(tenant, batch["id"], ids))
            self.stop.wait(self.cfg.batch_every)

    def _online(self, node: str) -> None:
        url = self.stack.engines[node].url + CHAT
        k = 0
        while not self.stop.wait(1.0 / self.cfg.online_rate):
            k += 1
            body = {
                "model": self.stack.model,
                "messages": [{"role": "user", "content": f"online {node} {k}"}],
                "max_tokens": 8,
            }
            try:
                ok = requests.post(url, json={**body, "priority": 0}, timeout=60).status_code == 200
            except requests.RequestException:
                ok = False
            self.online[node]["ok" if ok else "failed"] += 1


@dataclasses.dataclass
class Injected:
    fault: Fault
    injected_at: float  # seconds into the chaos window
    restored_at: float | None = None
    recovered_at: float | None = None
    note: str = ""


class Chaos:
    """Runs the schedule against a stack: each fault injected, its part restored, progress sampled each second."""

    def __init__(self, stack: Stack, faults: list[Fault]):
        self.stack, self.faults = stack, faults
        self.t0 = time.monotonic()
        self.log: list[Injected] = []
        self.samples: list[tuple[float, int]] = []
        self.exits: list[dict[str, t.Any]] = []  # children that exited on their own, restarted as a supervisor would
        self.lock = threading.Lock()  # a kill and its restart are one step for the supervision in _sample
        self.pending: list[threading.Thread] = []
        self.stop = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _sample(self) -> None:
        while not self.stop.wait(1.0):
            done = self.stack.completed()
            if done is not None:
                self.samples.append((self.now(), done))
            for slot in self.stack.engines.values():
                if not slot.down.is_set():
                    slot.sample_cpu()
            with self.lock:
                for child in self.stack.children.values():
                    if child.proc is not None and child.proc.poll() is not None:
                        self.exits.append(
                            {"at": round(self.now(), 1), "child": child.name, "rc": child.proc.returncode}
                        )
                        child.start()

    def run(self, until: float) -> None:
        self.t0 = time.monotonic()
        self.sampler.start()
        for fault in self.faults:
            if fault.at >= until:
                break
            time.sleep(max(0.0, fault.at - self.now()))
            entry = Injected(fault, self.now())
            self.log.append(entry)
            print(f"[chaos {entry.injected_at:6.1f} s] {fault.kind} {fault.target} {fault.hold or ''}", file=sys.stderr)
            try:
                self._inject(entry)
            except Exception as exc:  # the harness must go on; the report says what failed
                entry.note = f"injection failed: {type(exc).__name__}: {exc}"
        time.sleep(max(0.0, until - self.now()))
        for th in self.pending:  # engines still down come back, a paused Redis resumes
            th.join()

    def _later(self, entry: Injected, delay: float, restore: t.Callable[[], None]) -> None:
        def run() -> None:
            time.sleep(delay)
            try:
                restore()
                entry.restored_at = self.now()
            except Exception as exc:  # an engine that failed to start again: the report says so
                entry.note = f"restore failed: {type(exc).__name__}: {exc}"[:500]

        th = threading.Thread(target=run, daemon=True)
        th.start()
        self.pending.append(th)

    def _inject(self, entry: Injected) -> None:
        f, st = entry.fault, self.stack
        if f.kind == "engine":
            slot = st.engines[f.target.removeprefix("engine-")]
            if slot.down.is_set():
                entry.note = "skipped: that engine is still down from an earlier fault"
                return
            slot.kill9()
            self._later(entry, f.hold, slot.start)
        elif f.kind == "redis_stall":
            st.redis.pause()
            self._later(entry, f.hold, st.redis.resume)
        elif f.kind == "redis_restart":
            st.redis.restart()
            entry.restored_at = self.now()
        elif f.kind == "postgres_restart":
            st.pg.restart()
            entry.restored_at = self.now()
        else:  # kill -9 of a process, restarted at once as its supervisor would
            child = st.children[f.target]
            with self.lock:
                child.kill9()
                child.start()
            entry.restored_at = self.now()

    def recoveries(self) -> None:
        """Each fault's recovery: the first sample after its part was back in which more items had completed."""
        for entry in self.log:
            if entry.restored_at is None:
                continue
            before = [n for ts, n in self.samples if ts <= entry.restored_at]
            base = before[-1] if before else 0
            entry.recovered_at = next((ts for ts, n in self.samples if ts > entry.restored_at and n > base), None)

    def finish(self) -> None:
        self.stop.set()
        self.sampler.join(10)
        self.recoveries()


def verify(stack: Stack, submitted: list[Submitted], timeout: float) -> list[dict]:
    """Wait for every batch to end, then check its files through the API: one line per input line, no errors."""
    auth = {tenant: {"Authorization": f"Bearer {key}"} for tenant, key in stack.keys.items()}
    url = stack.api_url

    def get(tenant: str, path: str) -> requests.Response:
        for _ in range(30):  # the stack is whole again, but a restarted part may still be warming up
            try:
                r = requests.get(url + path, headers=auth[tenant], timeout=30)
                if r.status_code < 500:
                    r.raise_for_status()
                    return r
            except requests.ConnectionError:
                pass
            time.sleep(2.0)
        raise RuntimeError(f"the API did not answer GET {path}")

    deadline = time.monotonic() + timeout
    rows = []
    for sub in submitted:
        while (b := get(sub.tenant, f"/v1/batches/{sub.batch_id}").json())["status"] not in TERMINAL:
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
        out = get(sub.tenant, f"/v1/files/{b['output_file_id']}/content").text if b.get("output_file_id") else ""
        err = get(sub.tenant, f"/v1/files/{b['error_file_id']}/content").text if b.get("error_file_id") else ""
        seen = Counter(json.loads(line)["custom_id"] for line in out.splitlines())
        bad = [
            json.loads(line)["custom_id"]
            for line in out.splitlines()
            if json.loads(line)["response"]["status_code"] != 200
        ]
        rows.append(
            {
                "batch": sub.batch_id,
                "tenant": sub.tenant,
                "lines": len(sub.custom_ids),
                "status": b["status"],
                "request_counts": b["request_counts"],
                "lost": len(set(sub.custom_ids) - set(seen)),
                "duplicated": sum(n - 1 for n in seen.values() if n > 1),
                "unexpected": len(set(seen) - set(sub.custom_ids)),
                "error_lines": len(err.splitlines()) + len(bad),
            }
        )
    return rows


def invariants(rows: list[dict]) -> dict[str, bool]:
    return {
        "batches_submitted": bool(rows),
        "every_batch_completed": all(r["status"] == "completed" for r in rows),
        "no_line_lost": all(r["lost"] == 0 and r["unexpected"] == 0 for r in rows),
        "no_line_duplicated": all(r["duplicated"] == 0 for r in rows),
        "no_error_line": all(r["error_lines"] == 0 and r["request_counts"]["failed"] == 0 for r in rows),
    }


def run(cfg: ChaosConfig, base: Settings, out: Path) -> dict:
    """One chaos run: its report (also written to ``out/chaos.json`` by the caller)."""
    faults = schedule(cfg)
    stack = Stack(cfg, base, out)
    began = time.monotonic()
    try:
        stack.start()
        started_s = time.monotonic() - began
        load = Load(stack, cfg)
        chaos = Chaos(stack, faults)
        load.start()
        chaos.run(cfg.minutes * 60)
        load.finish()
        drain_began = time.monotonic()
        rows = verify(stack, load.submitted, cfg.drain_minutes * 60)
        drained_s = time.monotonic() - drain_began
        chaos.finish()
        wall = time.monotonic() - began
        for slot in stack.engines.values():
            slot.sample_cpu()
    finally:
        stack.close()
    checks = invariants(rows)
    return {
        "config": dataclasses.asdict(cfg),
        "ok": all(checks.values()),
        "invariants": checks,
        "totals": {
            "batches": len(rows),
            "lines": sum(r["lines"] for r in rows),
            "lost": sum(r["lost"] for r in rows),
            "duplicated": sum(r["duplicated"] for r in rows),
            "error_lines": sum(r["error_lines"] for r in rows),
        },
        "timing_s": {"stack_start": round(started_s, 1), "drain": round(drained_s, 1), "wall": round(wall, 1)},
        "faults": [
            {
                **dataclasses.asdict(e.fault),
                "injected_at": round(e.injected_at, 1),
                "restored_s": None if e.restored_at is None else round(e.restored_at - e.injected_at, 1),
                "recovery_s": None if e.recovered_at is None else round(e.recovered_at - e.injected_at, 1),
                "note": e.note,
            }
            for e in chaos.log
        ],
        "engines": {
            slot.name: {
                "starts_s": [round(s, 1) for s in slot.starts],
                "cpu_seconds": round(sum(slot.cpu.values()), 1),
                "cpu_share_of_one_core": round(sum(slot.cpu.values()) / wall, 3),
            }
            for slot in stack.engines.values()
        },
        "exited_on_their_own": chaos.exits,
        "online": {node: dict(c) for node, c in load.online.items()},
        "batches": rows,
    }
