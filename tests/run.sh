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

# Static checks first: they take seconds, a test run takes many minutes. Caches live under ~/.cache/tidal
# (mypy's is set in setup.cfg), never in the checkout.
echo "== ruff, mypy, import contracts"
ruff check .
ruff format --check .
mypy
lint-imports --cache-dir "$HOME/.cache/tidal/import-linter"

# The soaks (marked `soak`: a 180-s engine outage, the 3-minute chaos run) are minutes of the wall clock spent
# mostly waiting, so they run in a session of their own beside the SQLite pass, each session on its own Redis DB
# (tests/conftest.py) and temp dir; their output follows the pass's. Exit 5 is "no test selected" (a narrower
# selection in "$@").
echo "== pytest on SQLite (all but the slow stub-engine fault tests, which run on PostgreSQL below; the soaks beside)"
soak_dir=$(mktemp -d)
TIDAL_DATABASE_URL= python -m pytest -q -p no:cacheprovider --basetemp "$soak_dir/tmp" -m soak "$@" \
  >"$soak_dir/log" 2>&1 &
soak_pid=$!
trap 'kill -TERM "$soak_pid" 2>/dev/null || true' EXIT  # an interrupted run leaves no soak behind
main_rc=0
TIDAL_DATABASE_URL= python -m pytest -q --durations=15 -m "(not slow or engine) and not soak" "$@" || main_rc=$?
soak_rc=0
wait "$soak_pid" || soak_rc=$?
echo "== the soaks (run beside the SQLite pass)"
cat "$soak_dir/log"
rm -rf "$soak_dir"
[ "$main_rc" = 0 ] || exit "$main_rc"
[ "$soak_rc" = 0 ] || [ "$soak_rc" = 5 ] || exit "$soak_rc"
echo "== pytest on PostgreSQL (the tests that touch the store, but not the engine's; the rest ran above)"
TIDAL_DATABASE_URL=postgresql+psycopg2://postgres@127.0.0.1:5432/test python -m pytest -q -m "not no_sql and not engine" "$@"
