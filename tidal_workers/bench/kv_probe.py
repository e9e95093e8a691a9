"""Which vLLM KV connectors work on this CPU build, and what a freeze -> restart -> thaw round trip measures.

For each connector (``CONNECTORS``) the probe starts the dense local model with ``--kv-transfer-config``,
sends a prompt P under τ (greedy, fixed length), pushes P's blocks out of the small KV pool with other
prompts, sends P again in the same process (an in-process reload), restarts the engine and sends P once
more (a reload across process death). A reload is seen in the usage the engine reports:
``prompt_tokens_details.cached_tokens`` counts the tokens whose KV was not computed, and a fresh engine's
prefix cache is empty, so cached tokens after a restart came through the connector. Greedy token ids are
compared with the first answer's. The example connector also gets a prompt over τ (a chunked prefill), last,
since it may kill the engine core.

``thaw_ttft`` measures what A-P buys: TTFT of a thawed prompt (frozen by an engine that was then stopped)
against a recompute of a fresh prompt of the same length, in ABBA order on the restarted engine.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
import statistics
import time
import typing as t
from pathlib import Path

import requests

from tidal_engine.serve import Engine
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import EngineStartError
from tidal_engine.serve import start_engine

MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Connector:
    name: str  # a row of the probe table
    kv_connector: str
    extra: dict[str, t.Any]  # kv_connector_extra_config; "{dir}" is replaced by the probe's storage folder

    def transfer_config(self, storage: Path) -> str:
        extra = {k: (v.replace("{dir}", str(storage)) if isinstance(v, str) else v) for k, v in self.extra.items()}
        return json.dumps({"kv_connector": self.kv_connector, "kv_role": "kv_both", "kv_connector_extra_config": extra})


CONNECTORS = (
    Connector("example", "ExampleConnector", {"shared_storage_path": "{dir}"}),
    Connector("offloading", "OffloadingConnector", {"cpu_bytes_to_use": 256 * MIB}),
    Connector("simple-cpu", "SimpleCPUOffloadConnector", {"cpu_bytes_to_use": 256 * MIB}),
    Connector(
        "simple-disk",
        "SimpleCPUOffloadConnector",
        {
            "cpu_bytes_to_use": 64 * MIB,
            "kv_offload_backend": "disk",
            "disk_path": "{dir}",
            "disk_capacity_bytes": 1024 * MIB,
        },
    ),
    Connector("lmcache", "LMCacheConnectorV1", {}),
)


@dataclasses.dataclass(frozen=True)
class Answer:
    ttft_s: float
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int


class EngineDied(RuntimeError):
    pass


def prompt(seed: str, tokens: int) -> str:
    """``tokens`` characters (one token each with the byte-level tokenizer), distinct per ``seed``."""
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(tokens))


def ask(
    url: str, model: str, text: str, max_tokens: int, timeout: float = 300.0, kv_transfer_params: dict | None = None
) -> Answer:
    """One greedy streamed completion; TTFT is the first chunk that carries tokens."""
    body: dict[str, t.Any] = {
        "model": model,
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    if kv_transfer_params:
        body["kv_transfer_params"] = kv_transfer_params
    started = time.perf_counter()
    ttft: float | None = None
    ids: list[int] = []
    usage: dict[str, t.Any] = {}
    try:
        with requests.post(url + "/v1/completions", json=body, stream=True, timeout=timeout) as resp:
            if resp.status_code != 200:
                raise EngineDied(f"HTTP {resp.status_code}: {resp.text[:300]}")
            for line in resp.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    new = choice.get("token_ids") or []
                    if new and ttft is None:
                        ttft = time.perf_counter() - started
                    ids += new
                usage = chunk.get("usage") or usage
    except requests.RequestException as exc:
        raise EngineDied(f"{type(exc).__name__}: {exc}") from exc
    if ttft is None:
        raise EngineDied("no tokens in the answer")
    details = usage.get("prompt_tokens_details") or {}
    return Answer(ttft, ids, int(usage.get("prompt_tokens", 0)), int(details.get("cached_tokens") or 0))


@dataclasses.dataclass
class ProbeConfig:
    home: Path
    model_dir: Path
    work: Path
    shape: str = "dense"
    prompt_tokens: int = 1400
    long_tokens: int = 2900  # over tau: a chunked prefill
    max_tokens: int = 16
    tau: int = 2048
    kv_cache_bytes: str = "5M"  # 5,120 tokens of the dense model (1 KiB each): three other prompts evict P
    max_model_len: int = 3072  # the pool must hold one request of this length


def _options(cfg: ProbeConfig, connector: Connector, storage: Path, tau: int) -> EngineOptions:
    return EngineOptions(
        model=str(cfg.model_dir),
        served_model_name=cfg.shape,
        kv_cache_bytes=cfg.kv_cache_bytes,
        max_num_batched_tokens=tau,
        max_model_len=cfg.max_model_len,
        extra_args=("--kv-transfer-config", connector.transfer_config(storage), "--enable-prompt-tokens-details"),
    )


ROOT_CAUSE = re.compile(r"\b\w*(Error|Exception)\b: ")
WRAPPERS = ("Engine core initialization failed", "EngineDeadError", "EngineGenerateError")


def _error_line(log: Path) -> str:
    """The root cause in a failed engine's log: the last ``SomethingError: ...`` line that is not a wrapper."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    hits = [ln for ln in lines if ROOT_CAUSE.search(ln) and not any(w in ln for w in WRAPPERS)]
    line = hits[-1] if hits else (lines[-1] if lines else "no log")
    return line[line.find("] ") + 2 :].strip()[:400] if "] " in line else line.strip()[:400]


def _start(options: EngineOptions, log: Path) -> Engine | str:
    try:
        return start_engine(options, log_path=log, timeout_s=300)
    except EngineStartError:
        return _error_line(log)


def _same(a: Answer, b: Answer) -> bool:
    return a.token_ids == b.token_ids


def probe_connector(cfg: ProbeConfig, connector: Connector) -> dict[str, t.Any]:
    """One row of the probe table."""
    storage = cfg.work / connector.name
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)
    options = _options(cfg, connector, storage, cfg.tau)
    row: dict[str, t.Any] = {"connector": connector.name, "kv_connector": connector.kv_connector}
    p_text = prompt(f"{connector.name}-P", cfg.prompt_tokens)
    long_text = prompt(f"{connector.name}-L", cfg.long_tokens)
    engine = _start(options, cfg.work / f"{connector.name}-1.log")
    if isinstance(engine, str):
        return {**row, "starts": False, "error": engine}
    row["starts"] = True
    try:
        first = ask(engine.url, cfg.shape, p_text, cfg.max_tokens)
        row["first"] = {"ttft_s": round(first.ttft_s, 4), "prompt_tokens": first.prompt_tokens}
        if connector.name == "example":
            ask(engine.url, cfg.shape, long_text, cfg.max_tokens)  # frozen now, thawed (or not) after the restart
        fresh = [ask(engine.url, cfg.shape, prompt(f"{connector.name}-F{i}", cfg.prompt_tokens), 1) for i in range(3)]
        row["recompute_ttft_s"] = [round(a.ttft_s, 4) for a in fresh]
        again = ask(engine.url, cfg.shape, p_text, cfg.max_tokens)
        row["in_process"] = {
            "ttft_s": round(again.ttft_s, 4),
            "cached_tokens": again.cached_tokens,
            "same_output": _same(first, again),
        }
    except EngineDied as exc:
        row["error"] = f"{exc}; log: {_error_line(engine.log_path)}"
        return row
    finally:
        engine.stop()
    row["stored_bytes"] = sum(f.stat().st_size for f in storage.rglob("*") if f.is_file())
    engine = _start(options, cfg.work / f"{connector.name}-2.log")
    if isinstance(engine, str):
        return {**row, "error": f"restart failed: {engine}"}
    try:
        thawed = ask(engine.url, cfg.shape, p_text, cfg.max_tokens)
        row["after_restart"] = {
            "ttft_s": round(thawed.ttft_s, 4),
            "cached_tokens": thawed.cached_tokens,
            "same_output": _same(first, thawed),
        }
        if connector.name == "example":
            row["over_tau"] = _over_tau(engine, cfg, long_text)
    except EngineDied as exc:
        row["error"] = f"{exc}; log: {_error_line(engine.log_path)}"
    finally:
        engine.stop()
    return row


def _over_tau(engine: Engine, cfg: ProbeConfig, text: str) -> dict[str, t.Any]:
    """A prompt frozen by a chunked prefill, thawed after the restart: the example connector's known failure."""
    try:
        answer = ask(engine.url, cfg.shape, text, cfg.max_tokens, timeout=120)
    except EngineDied as exc:
        alive = engine.process.poll() is None
        return {
            "prompt_tokens": cfg.long_tokens,
            "ok": False,
            "engine_alive": alive,
            "error": _error_line(engine.log_path) or str(exc),
        }
    return {"prompt_tokens": answer.prompt_tokens, "ok": True, "cached_tokens": answer.cached_tokens}


def probe(cfg: ProbeConfig, names: t.Iterable[str]) -> list[dict[str, t.Any]]:
    wanted = set(names)
    return [probe_connector(cfg, c) for c in CONNECTORS if c.name in wanted]


@dataclasses.dataclass
class ThawConfig:
    model_dir: Path
    work: Path
    shape: str = "dense"
    lengths: tuple[int, ...] = (1000, 1500, 2000)
    reps: int = 5
    max_tokens: int = 16
    tau: int = 4096  # over the longest prompt: the example connector stores one prefill chunk only
    kv_cache_bytes: str = "64M"


def thaw_ttft(cfg: ThawConfig) -> dict[str, t.Any]:
    """Freeze ``reps`` prompts per length on one engine, restart, then time thawed against recomputed prompts."""
    example = CONNECTORS[0]
    storage = cfg.work / "thaw"
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)
    options = EngineOptions(
        model=str(cfg.model_dir),
        served_model_name=cfg.shape,
        kv_cache_bytes=cfg.kv_cache_bytes,
        max_num_batched_tokens=cfg.tau,
        max_model_len=max(4096, cfg.tau),
        extra_args=("--kv-transfer-config", example.transfer_config(storage), "--enable-prompt-tokens-details"),
    )
    frozen: dict[tuple[int, int], Answer] = {}
    engine = start_engine(options, log_path=cfg.work / "thaw-freeze.log", timeout_s=300)
    try:
        for n in cfg.lengths:
            for r in range(cfg.reps):
                frozen[(n, r)] = ask(engine.url, cfg.shape, prompt(f"thaw-{n}-{r}", n), cfg.max_tokens)
    finally:
        engine.stop()
    stored = sum(f.stat().st_size for f in storage.rglob("*") if f.is_file())
    frozen_tokens = sum(a.prompt_tokens for a in frozen.values())
    engine = start_engine(options, log_path=cfg.work / "thaw-thaw.log", timeout_s=300)
    rows: dict[int, dict[str, t.Any]] = {}
    try:
        for n in cfg.lengths:
            thawed: list[Answer] = []
            recomputed: list[Answer] = []
            for r in range(cfg.reps):  # ABBA: thaw, recompute, recompute, thaw, ...
                pair = [("thaw", r), ("recompute", r)]
                for kind, i in pair if r % 2 == 0 else pair[::-1]:
                    if kind == "thaw":
                        thawed.append(ask(engine.url, cfg.shape, prompt(f"thaw-{n}-{i}", n), cfg.max_tokens))
                    else:
                        recomputed.append(ask(engine.url, cfg.shape, prompt(f"fresh-{n}-{i}", n), cfg.max_tokens))
            rows[n] = _length_row(n, thawed, recomputed, [frozen[(n, r)] for r in range(cfg.reps)])
    finally:
        engine.stop()
    return {
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()},
        "stored_bytes": stored,
        "frozen_prompt_tokens": frozen_tokens,
        "bytes_per_token": round(stored / frozen_tokens, 1) if frozen_tokens else None,
        "by_length": rows,
    }


def _length_row(n: int, thawed: list[Answer], recomputed: list[Answer], frozen: list[Answer]) -> dict[str, t.Any]:
    th = [a.ttft_s for a in thawed]
    rc = [a.ttft_s for a in recomputed]
    ratios = sorted(r / h for r, h in zip(rc, th, strict=True))
    return {
        "prompt_tokens": n,
        "thawed_ttft_s": [round(x, 4) for x in th],
        "recompute_ttft_s": [round(x, 4) for x in rc],
        "thawed_median_s": round(statistics.median(th), 4),
        "recompute_median_s": round(statistics.median(rc), 4),
        "speedup_median": round(statistics.median(rc) / statistics.median(th), 2),
        # Paired ratios' range: with 5 pairs, min..max covers the median ratio with 94 % confidence.
        "speedup_pairs_min_max": [round(ratios[0], 2), round(ratios[-1], 2)],
        "thawed_cached_tokens": [a.cached_tokens for a in thawed],
        "bit_identical": all(a.token_ids == f.token_ids for a, f in zip(thawed, frozen, strict=True)),
    }
