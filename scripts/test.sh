#!/usr/bin/env bash
# The project's one test command (README, .ci/run): lint, types, the test suite, benchmark smoke runs.
# Extra arguments go to pytest. SCHED_FULL=1 also runs the long drills and benchmarks marked `slow`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "test.sh: .venv missing: run ./scripts/setup.sh first" >&2; exit 2; }

fail=0
step() { printf '\n== %s\n' "$*"; }

step "ruff"; .venv/bin/ruff check . || fail=1
step "mypy"; .venv/bin/mypy || fail=1

step "pytest"
"$PY" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure, not a pass" >&2
  fail=1
elif [ "$rc" -ne 0 ]; then
  fail=1
fi

step "benchmark smoke (ratios only; the full runs are documented in bench/README.md)"
"$PY" bench/bench_nextfire.py --quick || fail=1

exit "$fail"
