#!/usr/bin/env bash
# The one command that runs Tidal's tests: `bash tests/run.sh [pytest args]`.
# 1. starts Redis and PostgreSQL if either is down (this machine's own services);
# 2. builds (or reuses) a cached virtualenv keyed by setup.cfg, with the CPU vLLM engine;
# 3. runs the static checks (ruff lint and format, mypy, the import contracts); any finding fails the run;
# 4. runs the suite on SQLite, then every test that touches the store again on PostgreSQL, except those on the real
#    vLLM engine (their subject is the engine; the stub-engine tests cover the same store paths there). The slow
#    process-fault tests on a stub engine (marked `slow`) run on PostgreSQL only, production's store; the soaks
#    (marked `soak`) run beside the SQLite pass.
set -euo pipefail
cd "$(dirname "$0")/.."

redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || {
  echo "starting redis-server"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
}
pg_isready -h 127.0.0.1 -p 5432 -q || {
  echo "starting postgresql"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
}
# `docker compose config` validates docker-compose.yml; no Docker engine runs here, so Debian's
# compose v1 (a Python program) is enough where the v2 plugin is missing.
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || {
  echo "installing docker-compose (Debian package)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose) >/dev/null
}
# promtool checks and unit-tests the alert rules, and a real Prometheus scrapes a short run
# (tests/monitoring): Debian's `prometheus` package ships both.
command -v promtool >/dev/null && command -v prometheus >/dev/null || {
  echo "installing prometheus and promtool (Debian package)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) >/dev/null
}
# The front door compose ships (config/nginx/) runs in tests/deploy/test_front_door.py under a real nginx:
# Debian's `nginx` package (with TLS); the test starts its own nginx on a free port, with its own files.
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || {
  echo "installing nginx (Debian package)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx) >/dev/null
}
for _ in $(seq 30); do
  redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && pg_isready -h 127.0.0.1 -q && break
  sleep 1
done

# The cache key covers what decides the installed packages: setup.cfg up to its pytest section, and the
# post-install fixes.
key=$( (sed '/^\[tool:pytest\]/,$d' setup.cfg; cat tidal_engine/install.py) | sha256sum | cut -c1-12)
venv="${TIDAL_TEST_VENV:-$HOME/.cache/tidal/test-venv-$key}"
if [ ! -f "$venv/.complete" ]; then
  echo "building $venv (first run only: about 4 minutes)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -e ".[dev]"
  "$venv/bin/tidal" engine install-cpu
  touch "$venv/.complete"
else
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e .  # point the cached venv at this checkout
fi
export PATH="$venv/bin:$PATH"

# Home for the session-wide tiny model and engine cache (kept between runs).
export TIDAL_HOME="${TIDAL_HOME:-$HOME/.cache/tidal/test-home}"

# Every pass runs even when an earlier one fails (one flaky test must not hide the rest); each pass's summary
# line is printed again at the end, and the run exits non-zero if any pass failed. Exit 5 is "no test selected"
# (a narrower selection in "$@"), which is not a failure.
logs=$(mktemp -d)
# an interrupted run leaves no soak behind; SIGTERM tears the soaks' fixtures down (tests/support/interrupt.py)
trap 'kill -TERM "${soak_pid:-}" 2>/dev/null || true; rm -rf "$logs"' EXIT
failed=()
summaries=()
record() {  # record NAME RC LOG: remember the pass's outcome and its closing line
  local line
  line=$(grep -E "^[0-9]+ (passed|failed|errors?|deselected|skipped)|^no tests ran|^All checks passed|already formatted|would reformat|^Found [0-9]+ error|^Success: |^Contracts: " "$3" | tail -n 1 || true)
  summaries+=("$1: ${line:-exit $2}")
  [ "$2" = 0 ] || [ "$2" = 5 ] || failed+=("$1")
}
run_pass() {  # run_pass NAME COMMAND...: run it, its output shown as it goes and kept for the summary
  local name=$1 rc=0
  shift
  "$@" 2>&1 | tee "$logs/$name" || rc=$?
  record "$name" "$rc" "$logs/$name"
}

# Static checks first: they take seconds, a test run takes many minutes. Caches live under ~/.cache/tidal
# (mypy's is set in setup.cfg), never in the checkout.
echo "== ruff, mypy, import contracts"
run_pass ruff-check ruff check .
run_pass ruff-format ruff format --check .
run_pass mypy mypy
run_pass import-contracts lint-imports --cache-dir "$HOME/.cache/tidal/import-linter"

# The soaks (marked `soak`: a 180-s engine outage, the 3-minute chaos run) are minutes of the wall clock spent
# mostly waiting, so they run in a session of their own beside the SQLite pass, each session on its own Redis DB
# (tests/conftest.py) and temp dir; their output follows the pass's.
echo "== pytest on SQLite (all but the slow stub-engine fault tests, which run on PostgreSQL below; the soaks beside)"
soak_dir=$(mktemp -d)
TIDAL_DATABASE_URL= python -m pytest -q -p no:cacheprovider --basetemp "$soak_dir/tmp" -m soak "$@" \
  >"$logs/soaks" 2>&1 &
soak_pid=$!
TIDAL_DATABASE_URL= run_pass sqlite python -m pytest -q --durations=15 -m "(not slow or engine) and not soak" "$@"
soak_rc=0
wait "$soak_pid" || soak_rc=$?
echo "== the soaks (run beside the SQLite pass)"
cat "$logs/soaks"
record soaks "$soak_rc" "$logs/soaks"
rm -rf "$soak_dir"

echo "== pytest on PostgreSQL (the tests that touch the store, but not the engine's; the rest ran above)"
TIDAL_DATABASE_URL=postgresql+psycopg2://postgres@127.0.0.1:5432/test \
  run_pass postgresql python -m pytest -q -m "not no_sql and not engine" "$@"

echo "== summary"
printf '%s\n' "${summaries[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED passes: ${failed[*]}"
  exit 1
fi
