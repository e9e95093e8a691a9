"""Settings: read from TIDAL_* variables with type coercion, checked once at load, overridable, documented in
docs/configuration.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from config import SchedulerSettings
from config import load_scheduler_settings
from config import load_settings
from config.redact import redacted
from config.settings import Settings
from config.settings import SettingsError
from config.settings import documented_fields
from tidal_api.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_docs_hold_the_current_settings_table():
    result = CliRunner().invoke(main, ["config", "table"])
    assert result.exit_code == 0, result.output
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert result.output in doc, "stale docs: run `tidal config table --write docs/configuration.md`"
    assert len(result.output.splitlines()) == 2 + len(dataclasses.fields(Settings))


def test_table_write_replaces_only_the_marked_block(tmp_path):
    doc = tmp_path / "c.md"
    doc.write_text("intro\n<!-- tidal config table: begin -->\n| old |\n<!-- tidal config table: end -->\nafter\n")
    assert CliRunner().invoke(main, ["config", "table", "--write", str(doc)]).exit_code == 0
    table = CliRunner().invoke(main, ["config", "table"]).output
    assert doc.read_text() == (
        "intro\n<!-- tidal config table: begin -->\n" + table + "<!-- tidal config table: end -->\nafter\n"
    )
    doc.write_text("no markers\n")
    result = CliRunner().invoke(main, ["config", "table", "--write", str(doc)])
    assert result.exit_code != 0 and "markers" in result.output


def test_every_setting_has_a_doc_and_a_unique_variable():
    rows = documented_fields()
    assert all(doc.strip() for *_, doc in rows)
    assert len({name for name, *_ in rows}) == len(rows)
    assert {name: default for name, default, *_ in rows}["TIDAL_WORKER_METRICS_PORT"] == "9187"
    accepts = {name: accepts for name, _, accepts, _ in rows}
    assert (accepts["TIDAL_GATE_MODE"], accepts["TIDAL_KV_HIGH"], accepts["TIDAL_LEASE_SECONDS"]) == (
        "aimd, latency, fixed",
        "≥ 0, ≤ 1",
        "> 0",
    )


def test_values_are_coerced_to_each_fields_type():
    s = load_settings(
        {
            "TIDAL_API_WORKERS": "7",
            "TIDAL_KV_HIGH": "0.9",
            "TIDAL_SLA_STRICT": "Yes",
            "TIDAL_BIND": "0.0.0.0:1",
            "TIDAL_HOME": "/srv/t",
        }
    )
    assert (s.api_workers, s.kv_high, s.sla_strict, s.bind) == (7, 0.9, True, "0.0.0.0:1")
    assert isinstance(s.api_workers, int) and isinstance(s.kv_high, float)
    assert s.sqlalchemy_url == "sqlite:////srv/t/tidal.db" and s.blob_path == Path("/srv/t/blobs")
    assert load_settings({"TIDAL_SLA_STRICT": "0"}).sla_strict is False
    assert load_settings({"TIDAL_SLA_STRICT": "off"}).sla_strict is False


def test_empty_variables_count_as_unset_and_bad_numbers_fail():
    assert load_settings({"TIDAL_API_WORKERS": "", "TIDAL_REDIS_URL": ""}) == load_settings({})
    with pytest.raises(SettingsError, match=r"TIDAL_API_WORKERS='two': must be an integer \(default 2\)"):
        load_settings({"TIDAL_API_WORKERS": "two"})


def test_overrides_win_over_the_environment_and_only_tidal_variables_count():
    s = load_settings({"TIDAL_MAX_INFLIGHT": "8", "MAX_INFLIGHT": "99"}, max_inflight=3, node="n1")
    assert (s.max_inflight, s.node) == (3, "n1")
    assert load_settings({"MAX_INFLIGHT": "99"}).max_inflight == Settings().max_inflight
    assert s.replace(max_inflight=5).max_inflight == 5 and s.max_inflight == 3  # frozen; replace copies


def test_derived_urls_and_lists():
    s = load_settings(
        {
            "TIDAL_REDIS_URL": "redis://r:1/2",
            "TIDAL_MODELS": " a, b,,c ",
            "TIDAL_PRICES": '{"a": [1, 2], "*": [0.5, 1.5]}',
        }
    )
    assert s.celery_broker_url == "redis://r:1/2"
    assert load_settings({"TIDAL_BROKER_URL": "redis://b/0"}).celery_broker_url == "redis://b/0"
    assert s.model_list == ("a", "b", "c")
    assert s.price_table == {"a": (1.0, 2.0), "*": (0.5, 1.5)}


def test_configured_keys_parse_tenant_key_pairs():
    s = load_settings({"TIDAL_API_KEYS": " acme:k1 ,globex:k:2,", "TIDAL_ENV": "dev"})  # dev: short keys are fine
    assert s.configured_keys[:2] == (("acme", "k1"), ("globex", "k:2"))  # a key may itself hold a colon


def test_the_dev_key_exists_only_in_dev():
    assert load_settings({"TIDAL_ENV": "prod"}).configured_keys == ()
    assert load_settings({}).configured_keys == ()  # production is the default
    assert load_settings({"TIDAL_ENV": "dev", "TIDAL_API_KEYS": "acme:k1"}).configured_keys == (
        ("acme", "k1"),
        ("dev", "tidal-dev-key"),
    )


# --- checked once, at load --------------------------------------------------------------------------------


def _problems(environ: dict[str, str]) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load_settings(environ)
    assert str(caught.value).startswith("invalid Tidal settings")
    return caught.value.problems


@pytest.mark.parametrize(
    ("prices", "why"),
    [
        ('{"*": [0.15, 0.60]', "TIDAL_PRICES is not JSON"),
        ('[["*", 1, 2]]', "TIDAL_PRICES must be a JSON object"),
        ('{"*": [1]}', "TIDAL_PRICES['*'] = [1]: must be [input, output]"),
        ('{"*": [1, -2]}', "TIDAL_PRICES['*'] = [1, -2]: must be [input, output]"),
        ('{"*": ["1", 2]}', "TIDAL_PRICES['*'] = [\"1\", 2]: must be [input, output]"),
        ('{"tiny": [1, 2]}', 'TIDAL_PRICES has no "*" row'),
    ],
)
def test_a_bad_price_table_fails_at_load_naming_the_variable_and_the_fix(prices, why):
    (problem,) = _problems({"TIDAL_PRICES": prices})
    assert problem.startswith(why), problem
    assert "JSON object such as" in problem or "two non-negative numbers" in problem  # the fix


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ("acme:k1,justakey", "TIDAL_API_KEYS entry 2 is not tenant:key"),
        (":k1", "TIDAL_API_KEYS entry 1 is not tenant:key"),
        ("acme:", "TIDAL_API_KEYS entry 1 is not tenant:key"),
        ("acme:k1,globex:k1", "TIDAL_API_KEYS entry 2 repeats the key"),
        ("t" * 65 + ":k", "TIDAL_API_KEYS entry 1: the tenant name is longer than 64"),
    ],
)
def test_a_bad_api_key_entry_fails_at_load_and_never_echoes_a_key(keys, why):
    (problem,) = _problems({"TIDAL_API_KEYS": keys})
    assert problem.startswith(why), problem
    assert "k1" not in problem.split("e.g.")[0]  # the message names the entry, not its secret


@pytest.mark.parametrize(
    ("environ", "why"),
    [
        ({"TIDAL_GATE_MODE": "adaptive"}, "TIDAL_GATE_MODE='adaptive': must be one of aimd, latency, fixed."),
        ({"TIDAL_KV_LOW": "0.9"}, "TIDAL_KV_LOW=0.9 exceeds TIDAL_KV_HIGH=0.85"),
        ({"TIDAL_KV_HIGH": "1.5"}, "TIDAL_KV_HIGH=1.5: must be at least 0 and at most 1 (default 0.85)."),
        ({"TIDAL_MIN_INFLIGHT": "5", "TIDAL_MAX_INFLIGHT": "4"}, "TIDAL_MIN_INFLIGHT=5 exceeds TIDAL_MAX_INFLIGHT=4"),
        ({"TIDAL_SCHED_H_MIN": "0.5"}, "TIDAL_SCHED_H_MIN=0.5 exceeds TIDAL_SCHED_H_MAX=0.3"),
        ({"TIDAL_API_WORKERS": "0"}, "TIDAL_API_WORKERS=0: must be at least 1 (default 2)."),
        ({"TIDAL_LEASE_SECONDS": "0"}, "TIDAL_LEASE_SECONDS=0.0: must be above 0 (default 30.0)."),
        ({"TIDAL_LEASE_SECONDS": "nan"}, "TIDAL_LEASE_SECONDS=nan: must be a finite number."),
        ({"TIDAL_SCHED_GUARD": "1"}, "TIDAL_SCHED_GUARD=1.0: must be at least 0 and below 1 (default 0.2)."),
        ({"TIDAL_WORKER_METRICS_PORT": "70000"}, "TIDAL_WORKER_METRICS_PORT=70000: must be at least 0 and at most"),
        ({"TIDAL_REDIS_URL": "127.0.0.1:6379"}, "TIDAL_REDIS_URL='127.0.0.1:6379': must be a URL such as redis://"),
        ({"TIDAL_VLLM_URL": "localhost:8000"}, "TIDAL_VLLM_URL='localhost:8000': must be a URL such as http://"),
        ({"TIDAL_DATABASE_URL": "tidal.db"}, "TIDAL_DATABASE_URL='tidal.db': must be a URL (scheme://...)"),
        ({"TIDAL_FLOWER_BASIC_AUTH": "admin"}, "TIDAL_FLOWER_BASIC_AUTH: must be user:password"),
    ],
)
def test_values_out_of_range_fail_at_load_naming_the_variable(environ, why):
    (problem,) = _problems(environ)
    assert problem.startswith(why), problem


def test_one_start_reports_every_bad_variable_at_once():
    problems = _problems({"TIDAL_API_WORKERS": "two", "TIDAL_PRICES": "{", "TIDAL_GATE_MODE": "x", "TIDAL_KV_LOW": "1"})
    named = sorted(p.split("=")[0].split(" ")[0] for p in problems)
    assert named == ["TIDAL_API_WORKERS", "TIDAL_GATE_MODE", "TIDAL_KV_LOW", "TIDAL_PRICES"]


def test_overrides_and_replace_are_checked_too():
    with pytest.raises(SettingsError, match="TIDAL_KV_LOW"):
        load_settings({}, kv_low=0.99)
    with pytest.raises(SettingsError, match="TIDAL_PRICES"):
        load_settings({}).replace(prices="not json")


def test_parsed_values_are_parsed_once_and_kept():
    s = load_settings(
        {"TIDAL_PRICES": '{"*": [1, 2]}', "TIDAL_API_KEYS": "a:k", "TIDAL_MODELS": "m", "TIDAL_ENV": "dev"}
    )
    assert s.configured_keys is s.configured_keys and s.model_list is s.model_list
    assert s.price_table == {"*": (1.0, 2.0)} and s.price_table["*"] is s.price_table["*"]
    with pytest.raises(TypeError):
        s.price_table["*"] = (0.0, 0.0)  # read-only: every reader shares it


def test_tidal_commands_refuse_a_bad_variable_with_its_name_and_no_traceback():
    result = CliRunner().invoke(main, ["config", "show"], env={"TIDAL_PRICES": "{oops"})
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: invalid Tidal settings") and "TIDAL_PRICES is not JSON" in result.output
    assert "Traceback" not in result.output


# --- quotas, metrics listener, secrets ----------------------------------------------------------------------


def test_tenant_limits_override_the_defaults_per_tenant_and_model():
    s = load_settings(
        {
            "TIDAL_LIMIT_OPEN_BATCHES": "7",
            "TIDAL_TENANT_LIMITS": '{"acme": {"open_batches": 500, "enqueued_tokens": {"*": 10, "big": 99}}, '
            '"globex": {"enqueued_tokens": 5}}',
        }
    )
    acme, globex, other = s.limits_for("acme"), s.limits_for("globex"), s.limits_for("initech")
    assert (acme.open_batches, acme.stored_bytes) == (500, s.limit_stored_bytes)
    assert (acme.tokens_for("big"), acme.tokens_for("small")) == (99, 10)
    assert (globex.open_batches, globex.tokens_for("any")) == (7, 5)
    assert other.tokens_for("any") == s.limit_enqueued_tokens and other.open_batches == 7


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        ('{"acme": ', "TIDAL_TENANT_LIMITS is not JSON"),
        ('["acme"]', "TIDAL_TENANT_LIMITS must be a JSON object"),
        ('{"acme": {"batches": 1}}', "TIDAL_TENANT_LIMITS['acme'] must be an object of open_batches"),
        ('{"acme": {"open_batches": -1}}', "TIDAL_TENANT_LIMITS['acme']['open_batches'] = -1: must be a non-negative"),
        ('{"acme": {"enqueued_tokens": {"m": 1.5}}}', "TIDAL_TENANT_LIMITS['acme']['enqueued_tokens'] = {\"m\": 1.5}"),
    ],
)
def test_bad_tenant_limits_fail_at_load(limits, why):
    (problem,) = _problems({"TIDAL_TENANT_LIMITS": limits})
    assert problem.startswith(why), problem


def test_flowers_passwords_are_as_strong_as_api_keys_outside_dev_mode():
    """Flower's credentials can stop workers and send any task: a guessable password is refused at load."""
    strong = "n1My27wL_ZAEeFkei4dgmhLtQpO9wY6vmFJZ"
    assert load_settings({"TIDAL_FLOWER_BASIC_AUTH": f"admin:{strong}"}).flower_basic_auth == f"admin:{strong}"
    (problem,) = _problems({"TIDAL_FLOWER_BASIC_AUTH": "admin:secret"})
    assert problem.startswith("TIDAL_FLOWER_BASIC_AUTH pair 1: the password is 6 characters long"), problem
    assert "secret " not in problem and ":secret" not in problem  # the reason never quotes the password
    (problem,) = _problems({"TIDAL_FLOWER_BASIC_AUTH": f"admin:{strong},ops:" + "Zx9" * 7})
    assert problem.startswith("TIDAL_FLOWER_BASIC_AUTH pair 2: the password is 21 characters long"), problem
    (problem,) = _problems({"TIDAL_FLOWER_BASIC_AUTH": f"admin:{strong},ops"})
    assert problem.startswith("TIDAL_FLOWER_BASIC_AUTH: must be user:password"), problem
    assert load_settings({"TIDAL_ENV": "dev", "TIDAL_FLOWER_BASIC_AUTH": "admin:secret"}).flower_basic_auth


def test_worker_metrics_bind_loopback_unless_told_otherwise():
    assert load_settings({}).worker_metrics_host == "127.0.0.1"
    assert load_settings({"TIDAL_WORKER_METRICS_HOST": "0.0.0.0"}).worker_metrics_host == "0.0.0.0"


def test_the_metrics_listener_must_not_share_the_public_port():
    (problem,) = _problems({"TIDAL_BIND": "0.0.0.0:8080", "TIDAL_METRICS_BIND": "127.0.0.1:8080"})
    assert "must not be served on the API's public port" in problem
    (problem,) = _problems({"TIDAL_METRICS_BIND": "9180"})
    assert problem.startswith("TIDAL_METRICS_BIND='9180': must be host:port")
    assert load_settings({"TIDAL_METRICS_BIND": "0.0.0.0:9180"}).metrics_bind == "0.0.0.0:9180"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        ("postgresql+psycopg2://tidal:p@ss:w@db:5432/tidal", "postgresql+psycopg2://tidal:***@db:5432/tidal"),
        ("rediss://u:pw@[::1]:6380/0?password=pw&db=1", "rediss://u:***@[::1]:6380/0?password=***&db=1"),
        ("tidal:pw@db/tidal (no scheme)", "tidal:***@db/tidal (no scheme)"),
        ("no Redis at redis://127.0.0.1:6379/0 at 12:00:00", "no Redis at redis://127.0.0.1:6379/0 at 12:00:00"),
        ("sqlite:////home/me/tidal.db", "sqlite:////home/me/tidal.db"),
    ],
)
def test_redacted_masks_the_password_of_every_url_in_a_text(text, shown):
    assert redacted(text) == shown


def test_a_bad_url_setting_is_quoted_without_its_password():
    problems = _problems(
        {
            "TIDAL_REDIS_URL": "http://:redis-s3cret@redis.internal:6379/0",
            "TIDAL_DATABASE_URL": "tidal:pg-s3cret@db/tidal",
        }
    )
    assert problems == [
        "TIDAL_REDIS_URL='http://:***@redis.internal:6379/0': must be a URL such as redis://127.0.0.1:6379/0.",
        "TIDAL_DATABASE_URL='tidal:***@db/tidal': must be a URL (scheme://...), or empty for the default.",
    ]


def test_config_show_masks_every_secret_and_every_password_in_a_url():
    env = {
        "TIDAL_ENV": "dev",
        "TIDAL_API_KEYS": "acme:sk-live-key",
        "TIDAL_S3_SECRET_ACCESS_KEY": "s3-secret",
        "TIDAL_FLOWER_BASIC_AUTH": "admin:flower-secret",
        "TIDAL_DATABASE_URL": "postgresql+psycopg2://tidal:pg-secret@db.internal:5432/tidal",
        "TIDAL_REDIS_URL": "redis://:redis-secret@redis.internal:6379/0",
        "TIDAL_BROKER_URL": "redis://user:broker-secret@[::1]:6379/1",
    }
    result = CliRunner().invoke(main, ["config", "show"], env=env)
    assert result.exit_code == 0, result.output
    for secret in ("sk-live-key", "s3-secret", "flower-secret", "pg-secret", "redis-secret", "broker-secret"):
        assert secret not in result.output, secret
    shown = dict(line.split("=", 1) for line in result.output.splitlines())
    assert shown["TIDAL_DATABASE_URL"] == "postgresql+psycopg2://tidal:***@db.internal:5432/tidal"
    assert shown["TIDAL_REDIS_URL"] == "redis://:***@redis.internal:6379/0"
    assert shown["TIDAL_BROKER_URL"] == "redis://user:***@[::1]:6379/1"
    assert shown["TIDAL_S3_SECRET_ACCESS_KEY"] == shown["TIDAL_API_KEYS"] == "***"
    assert shown["TIDAL_VLLM_URL"] == "http://127.0.0.1:8000"  # nothing to hide, shown as it is


def test_the_scheduler_plugin_reads_its_own_variables_alone():
    """Inside vLLM's engine core the plugin parses TIDAL_SCHED_* only: a bad key, price or tenant limit there is
    the API's and the workers' business, not a reason for the engine to refuse to start."""
    environ = {
        "TIDAL_SCHED_TBT_SLO_MS": "120",
        "TIDAL_SCHED_H_MAX": "0.4",
        "TIDAL_API_KEYS": "not a key list",
        "TIDAL_PRICES": "{not json",
        "TIDAL_TENANT_LIMITS": "[]",
    }
    with pytest.raises(SettingsError):
        load_settings(environ)
    s = load_scheduler_settings(environ)
    assert type(s) is SchedulerSettings
    assert (s.sched_tbt_slo_ms, s.sched_h_max) == (120.0, 0.4)
    assert s.sched_budget_seconds == pytest.approx(0.120 * (1 - s.sched_guard))
    assert not hasattr(s, "api_keys")


def test_the_scheduler_settings_are_checked_on_their_own():
    with pytest.raises(SettingsError, match=r"TIDAL_SCHED_H_MIN=0\.5 exceeds TIDAL_SCHED_H_MAX=0\.3"):
        load_scheduler_settings({"TIDAL_SCHED_H_MIN": "0.5", "TIDAL_SCHED_H_MAX": "0.3"})
    with pytest.raises(SettingsError, match="TIDAL_SCHED_GUARD"):
        load_scheduler_settings({"TIDAL_SCHED_GUARD": "1.5"})
