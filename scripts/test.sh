#!/usr/bin/env bash
# The project's one test command (README, .ci/run): lint, types, the test suite, benchmark smoke runs
# (SCHED_FULL=1: also the long drills on real processes).
# Extra arguments go to pytest. SCHED_FULL=1 also runs the long drills and benchmarks marked `slow`, and the
# API fuzz tests' long mode (tests/unit/api/test_fuzz.py: over 100,000 requests with auth on, ~6 min).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "test.sh: .venv missing: run ./scripts/setup.sh first" >&2; exit 2; }

fail=0
step() { printf '\n== %s\n' "$*"; }

step "ruff"; .venv/bin/ruff check . || fail=1
step "mypy"; .venv/bin/mypy || fail=1

run_pytest() {
  "$PY" -m pytest "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests ($*): that is a failure, not a pass" >&2
    fail=1
  elif [ "$rc" -ne 0 ]; then
    fail=1
  fi
}

# Tests that hold no lag, TTL or RTO bound against the machine's own speed run on both cores
# (pytest-xdist, a module's tests on one worker); everything else, the drills and the integration
# tests on real processes, runs alone afterwards, since their bounds assume the machine is theirs
# (in parallel the smoke drill and two coordination drills failed their bounds). A new test
# directory is serial until it is listed here.
# tests/deploy: its pure validators (files checked by hadolint, promtool, kustomize, ...) run here; the ones
# that start etcd, planners or Prometheus (test_image_commands, test_prometheus_live, test_etcd_restore) do not.
PARALLEL=(tests/unit tests/worker tests/chaos tests/client tests/store
          tests/deploy/test_metric_names.py tests/deploy/test_prometheus_rules.py tests/deploy/test_dashboard.py
          tests/deploy/test_compose.py tests/deploy/test_kubernetes.py tests/deploy/test_dockerfile.py)
if [ "$#" -gt 0 ]; then
  step "pytest $*"
  run_pytest "$@"
else
  step "pytest, in parallel: ${PARALLEL[*]}"
  run_pytest -n 2 --dist loadfile "${PARALLEL[@]}"
  step "pytest, one at a time: the rest of tests/"
  run_pytest tests "${PARALLEL[@]/#/--ignore=}"
fi

step "benchmark smoke (ratios only; the full runs are documented in bench/README.md)"
"$PY" bench/bench_nextfire.py --quick || fail=1
"$PY" bench/bench_affinity.py --quick || fail=1
"$PY" bench/bench_tls.py --quick || fail=1  # mTLS against plaintext on the worker stream path
"$PY" bench/bench_cli.py --quick || fail=1  # schedctl start time: a few subprocesses (about 3 s)
"$PY" bench/bench_create.py --quick || fail=1  # API create, single against batch (etcd + a service process)
"$PY" bench/bench_scale.py --quick || fail=1  # 20,000 schedules on 2 planners (about 30 s)
"$PY" bench/bench_e2e.py --quick || fail=1  # etcd, a planner and a no-op worker as processes (about 17 s)
"$PY" bench/bench_member_pause.py --quick || fail=1  # an etcd follower paused, with and without ejection (12 s)
"$PY" bench/bench_e2e.py --quick --materialize-only --rates 2000 || fail=1  # P1's mode: nothing due (about 25 s)
"$PY" bench/bench_burst.py --quick || fail=1  # 200 then 2,000 schedules due at one instant on 2 planners (about 25 s)

# The drills on real processes (docs/drills.md) beyond those in the test suite. The smoke drill (F1, F2 beyond
# the lease, F3, F5, F6, F7; about 5 minutes) and the region drill (the primary's failover, a switchover
# back; about 3) are in the suite, so in every CI run (tests/integration/test_drill_smoke.py,
# test_drill_regions.py); full mode adds one regression drill per audit finding, the region cut and the
# 30-minute game day.
if [ "${SCHED_FULL:-0}" = "1" ]; then
  runs=${SCHED_DRILL_DIR:-$(mktemp -d)}
  for scenario in chaos/scenarios/regress-*.toml chaos/scenarios/regions-cut.toml chaos/scenarios/game-day.toml; do
    name=$(basename "$scenario" .toml)
    step "drill $name (run directory $runs/$name)"
    if ! .venv/bin/schedctl drill run "$scenario" --report "$runs/$name"; then
      fail=1
      sed -n '1,40p' "$runs/$name/report.md" 2>/dev/null
    fi
  done
fi

exit "$fail"
