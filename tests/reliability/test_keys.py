"""Key lifecycle: `tidal keys create|list|revoke`, TIDAL_API_KEYS as the truth for the keys it manages, weak keys.

The revocation of a key on a real `tidal serve` with two gunicorn workers is in tests/api/test_serve.py.
"""

from __future__ import annotations

import json
import secrets

import pytest
import requests
from click.testing import CliRunner

from config import load_settings
from config.settings import SettingsError
from config.settings import weak_key
from tidal_api.cli import main
from tidal_workers.store import Store
from tidal_workers.store import api_keys


def strong() -> str:
    return "sk-" + secrets.token_urlsafe(32)


def tidal_cli(rt, *args: str, api_keys: str = "", code: int = 0) -> tuple[str, str]:
    """Run `tidal ...` on the test's store with TIDAL_API_KEYS = ``api_keys``; (stdout, stderr)."""
    env = {"TIDAL_HOME": rt.settings.home, "TIDAL_DATABASE_URL": rt.settings.database_url, "TIDAL_API_KEYS": api_keys}
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == code, result.output + result.stderr
    return result.stdout, result.stderr


def keys_cli(rt, *args: str) -> tuple[str, str]:
    """Run `tidal keys ...` on the test's store; (stdout, stderr)."""
    return tidal_cli(rt, "keys", *args)


def get_files(url: str, key: str) -> int:
    return requests.get(url + "/v1/files", headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("change-me", "a published example key"),
        ("acme-key", "a published example key"),
        ("sk-tidal-example-0123456789abcdef", "a published example key"),
        ("a1b2c3d4e5f6a7b8c9d0e1f2a3b4", "28 characters long"),
        ("94821993518190937865797543231948", "only 106 bits strong by its character set"),  # 32 digits
        # few distinct characters, or a repeat, once scored by their character set alone (160 to 300 bits)
        ("a" * 32, "made of only 1 distinct characters"),
        ("x7Q2" * 10, "made of only 4 distinct characters"),
        ("sk-serve-" + "x7Q2" * 10, "only 85 bits strong by its character set, its repeats counted once"),
        ("Password1!" * 4, "only 66 bits strong by its character set, its repeats counted once"),
        ("1234567890" * 4, "only 33 bits strong by its character set, its repeats counted once"),
    ],
)
def test_weak_and_example_keys_are_named(key, why):
    reason = weak_key(key)
    assert reason is not None and reason.startswith(why), reason
    assert key not in reason  # the reason never quotes the key


def test_random_keys_pass_the_weak_key_check():
    assert weak_key("5260181590830166131860913909960308246281") is None  # 40 digits: 132.9 bits, just over
    assert weak_key("0123456789abcdef" * 2) is not None and weak_key(secrets.token_hex(16)) is None  # 128 bits
    assert weak_key(strong()) is None


def test_weak_keys_are_refused_outside_dev_mode_and_accepted_in_it():
    with pytest.raises(SettingsError) as caught:
        load_settings({"TIDAL_API_KEYS": "acme:change-me,globex:" + strong()})
    (problem,) = caught.value.problems
    assert problem.startswith("TIDAL_API_KEYS entry 1 is a published example key") and "change-me" not in problem
    assert load_settings({"TIDAL_ENV": "dev", "TIDAL_API_KEYS": "acme:change-me"}).configured_keys[0] == (
        "acme",
        "change-me",
    )
    key = strong()
    assert load_settings({"TIDAL_API_KEYS": f"acme:{key}"}).configured_keys == (("acme", key),)
    assert weak_key(api_keys.generate_key()) is None


def test_the_example_env_file_holds_no_working_key():
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[2] / "tidal.env.example").read_text().splitlines()
    environ = dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    assert load_settings(environ).configured_keys == ()


def test_configured_keys_are_added_and_moved_and_revoked_only_with_prune(rt, live_api, caplog):
    one, two = strong(), strong()
    configured = Store(rt.settings.replace(api_keys=f"acme:{one},globex:{two}"))
    api_keys.sync(configured)
    assert (api_keys.tenant_for_key(configured, one), api_keys.tenant_for_key(configured, two)) == ("acme", "globex")
    _row, made = api_keys.create(rt.store, "initech", "ci")  # a CLI key: no setting manages it

    # next start: `two` moved to acme; `one` and the test's own acme-key/globex-key left the setting but stay live
    moved = Store(rt.settings.replace(api_keys=f"acme:{two}"))
    report = api_keys.sync(moved)
    assert (report.added, report.moved, report.revoked, report.unlisted) == (0, 1, 0, 3)
    assert "left TIDAL_API_KEYS: still live until `tidal keys sync --prune`" in caplog.text
    assert api_keys.tenant_for_key(moved, two) == "acme" and api_keys.tenant_for_key(moved, one) == "acme"
    assert get_files(live_api.url, one) == 200 and get_files(live_api.url, two) == 200

    # an explicit prune revokes them, each one logged; a CLI key is no business of the setting's
    caplog.clear()
    assert api_keys.sync(moved, prune=True) == api_keys.SyncReport(0, 0, 3, 0, 0)
    assert caplog.text.count("left TIDAL_API_KEYS: revoked (--prune)") == 3
    assert api_keys.sync(moved, prune=True) == api_keys.SyncReport(0, 0, 0, 0, 0)  # nothing more to do
    assert api_keys.tenant_for_key(moved, one) is None and api_keys.tenant_for_key(moved, "acme-key") is None
    assert api_keys.tenant_for_key(moved, made) == "initech"
    assert get_files(live_api.url, one) == 401 and get_files(live_api.url, made) == 200

    # a revoked key stays revoked, even if the setting names it again
    back = Store(rt.settings.replace(api_keys=f"acme:{two},acme:{one}"))
    assert api_keys.sync(back).kept_revoked == 1
    assert api_keys.tenant_for_key(back, one) is None
    for store in (configured, moved, back):
        store.dispose()


def test_db_upgrade_without_the_setting_keeps_configured_keys(rt, live_api):
    """The documented maintenance path: `tidal db upgrade` from a shell where TIDAL_API_KEYS is unset."""
    key = strong()
    api_keys.sync(Store(rt.settings.replace(api_keys=f"acme:{key}")))
    tidal_cli(rt, "db", "upgrade", api_keys="")
    assert get_files(live_api.url, key) == 200 and get_files(live_api.url, "acme-key") == 200
    assert all(row.revoked_at is None for row in api_keys.listed(rt.store))


def test_keys_sync_prunes_only_when_asked_and_never_with_an_empty_setting(rt, live_api):
    key, dropped = strong(), strong()
    tidal_cli(rt, "keys", "sync", api_keys=f"acme:{key},globex:{dropped}")
    out, _ = tidal_cli(rt, "keys", "sync", api_keys=f"acme:{key}")
    assert "revoked 0" in out and get_files(live_api.url, dropped) == 200
    _, err = tidal_cli(rt, "keys", "sync", "--prune", code=1)  # a shell without the setting must not revoke all
    assert "TIDAL_API_KEYS names no key" in err and get_files(live_api.url, dropped) == 200
    out, _ = tidal_cli(rt, "keys", "sync", "--prune", api_keys=f"acme:{key}")
    assert "revoked 3" in out  # `dropped`, and the test's acme-key and globex-key
    assert get_files(live_api.url, dropped) == 401 and get_files(live_api.url, key) == 200


def test_cli_creates_lists_and_revokes_keys(rt, live_api):
    out, err = keys_cli(rt, "create", "--tenant", "initech", "--name", "nightly jobs")
    key = out.strip()
    assert weak_key(key) is None and "shown only now" in err
    (row,) = [json.loads(line) for line in keys_cli(rt, "list", "--tenant", "initech", "--json")[0].splitlines()]
    assert row["name"] == "nightly jobs" and row["source"] == "cli" and row["revoked_at"] is None
    assert row["last_used_at"] is None and row["hint"] == key[:3] + "..." + key[-4:]
    assert get_files(live_api.url, key) == 200
    listed = keys_cli(rt, "list")[0]
    assert key not in listed and row["id"] in listed and "nightly jobs" in listed
    (row,) = [json.loads(line) for line in keys_cli(rt, "list", "--tenant", "initech", "--json")[0].splitlines()]
    assert row["last_used_at"] is not None  # the request above used it

    out, _ = keys_cli(rt, "revoke", row["id"])
    assert out.startswith(f"revoked {row['id']} (tenant initech)")
    assert get_files(live_api.url, key) == 401  # the next request, same process, no restart
    (row,) = [json.loads(line) for line in keys_cli(rt, "list", "--tenant", "initech", "--json")[0].splitlines()]
    assert row["revoked_at"] is not None
    assert api_keys.sync(rt.store).revoked == 0  # a CLI key is no business of the setting's


def test_cli_refuses_an_unknown_key_id(rt):
    env = {"TIDAL_HOME": rt.settings.home, "TIDAL_DATABASE_URL": rt.settings.database_url}
    result = CliRunner().invoke(main, ["keys", "revoke", "key_nope"], env=env)
    assert result.exit_code == 1 and "no key with id key_nope" in result.output
