"""What every `tidal bench` command shares: its options, its output folder and provenance, its ending."""

from __future__ import annotations

import contextlib
import json
import typing as t
from pathlib import Path

import click

from config import load_settings


def out_option(name: str) -> t.Callable[[t.Callable], t.Callable]:
    return click.option(
        "--out", type=click.Path(file_okay=False), default=f"bench-out/{name}", show_default=True, help="Output folder."
    )


def engine_url_option(what: str) -> t.Callable[[t.Callable], t.Callable]:
    return click.option("--engine-url", help=f"Engine to measure. Default: start {what} here.")


PROFILE_OPTION = click.option(
    "--profile", default="qwen2.5-7b@a6000", show_default=True, help="The twin's GPU profile."
)


def engine_kind_options(*kinds: str) -> t.Callable[[t.Callable], t.Callable]:
    """``--engine`` (into ``kind``) and ``--profile``: the engines a benchmark starts itself."""
    cpu = " / ".join(k for k in kinds if k != "twin")

    def apply(f: t.Callable) -> t.Callable:
        f = PROFILE_OPTION(f)
        return click.option(
            "--engine",
            "kind",
            type=click.Choice(list(kinds)),
            default="twin",
            show_default=True,
            help=f"twin: real vLLM with a GPU's step times (--profile); {cpu}: the CPU engine computing for real.",
        )(f)

    return apply


MODEL_OPTION = click.option("--model", default="tiny", show_default=True, help="Model name clients send.")


def begin(name: str, out: str) -> tuple[Path, dict]:
    """The output folder, made, and the provenance block taken now (argv, commit, vLLM, machine, UTC, load)."""
    from tidal_workers.bench import provenance

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path, provenance.record(name)


def finish(
    name: str,
    origin: dict,
    results: dict,
    out_dir: Path,
    headline: t.Any,
    files: t.Sequence[Path] = (),
    *,
    indent: int | None = 2,
) -> None:
    """Every bench command's ending: NAME.json (provenance first), the headline on stdout, the paths on stderr."""
    from tidal_workers.bench import provenance

    path = out_dir / f"{name}.json"
    origin = {**origin, "finished_utc": provenance.utc_now(), "load_average_end": provenance.load_average()}
    path.write_text(json.dumps({**origin, **results}, indent=indent, default=str))
    click.echo(headline if isinstance(headline, str) else json.dumps(headline, indent=2, default=str))
    click.echo(f"results: {path}" + "".join(f"; {f}" for f in files), err=True)


@contextlib.contextmanager
def tiny_engine(url: str | None, out_dir: Path, max_num_seqs: int) -> t.Iterator[str]:
    """The engine to measure: a URL as given, or the tiny CPU engine started (and stopped) here."""
    if url:
        yield url
        return
    from tidal_engine.serve import start_tiny

    engine = start_tiny(load_settings(), log_path=out_dir / "engine.log", max_num_seqs=max_num_seqs)
    try:
        yield engine.url
    finally:
        engine.stop()


def deployment_ceiling(profile: str, max_num_seqs: int) -> int:
    """The gate ceiling a node in front of ``profile``'s GPU gets by default (`TIDAL_MAX_INFLIGHT` 0): the
    engine's slots and the requests its KV pool holds, the smaller, less the online headroom."""
    from tidal_engine.twin import load_profile
    from tidal_workers.gate import configured_ceiling

    spec = load_profile(profile)
    node = load_settings().replace(max_inflight=0, max_num_seqs=max_num_seqs or spec.max_num_seqs)
    return configured_ceiling(node, spec.kv_pool_tokens)


def log(line: str) -> None:
    click.echo(line, err=True)


def numbers(text: str) -> tuple[float, ...]:
    """A comma-separated option's numbers; blanks skipped."""
    return tuple(float(x) for x in text.split(",") if x.strip())
