"""Settings: read from TIDAL_* variables with type coercion, overridable, documented in docs/configuration.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from config import load_settings
from config.settings import Settings
from config.settings import documented_fields
from tidal_api.cli import main

ROOT = Path(__file__).resolve().parents[1]


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
    assert all(doc.strip() for _, _, doc in rows)
    assert len({name for name, _, _ in rows}) == len(rows)
    assert {name: default for name, default, _ in rows}["TIDAL_WORKER_METRICS_PORT"] == "9187"


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
    with pytest.raises(ValueError):
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
    assert s.model_list == ["a", "b", "c"]
    assert s.price_table == {"a": (1.0, 2.0), "*": (0.5, 1.5)}


def test_configured_keys_parse_tenant_key_pairs():
    s = load_settings({"TIDAL_API_KEYS": " acme:k1 ,globex:k:2,", "TIDAL_ENV": "prod"})
    assert s.configured_keys == [("acme", "k1"), ("globex", "k:2")]  # a key may itself hold a colon


def test_a_malformed_api_key_entry_is_refused():
    s = load_settings({"TIDAL_API_KEYS": "acme:k1,justakey"})
    with pytest.raises(ValueError, match="tenant:key"):
        _ = s.configured_keys


def test_the_dev_key_exists_only_in_dev():
    assert load_settings({"TIDAL_ENV": "prod"}).configured_keys == []
    assert load_settings({}).configured_keys == []  # production is the default
    assert load_settings({"TIDAL_ENV": "dev", "TIDAL_API_KEYS": "acme:k1"}).configured_keys == [
        ("acme", "k1"),
        ("dev", "tidal-dev-key"),
    ]
