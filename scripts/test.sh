#!/usr/bin/env bash
# The whole suite (default) or the quick loop (`quick`: lint, unit tests, one cluster launch).
# Run through `make test` / `make check`, which install everything first (the node image is
# built here, beside the lint and the unit tests, which need none).
#
# What does not disturb each other runs side by side, each into a log of its own that is
# printed whole when it ends:
#   1. unit tests (two pytest-xdist workers: half their time is waiting) | the node image build
#   2. the cluster tests (two pytest-xdist workers; tests/integration/conftest.py keeps the tests
#      of one shared cluster, and those on this machine's own nodes, in one worker each)
#      | the Molecule scenarios (clusters of their own, mol-*), niced: the cluster tests'
#        timed checks (a failure's stop within seconds, the live view's lag) come first, and
#        Molecule's six scenarios fill the cores beside them
#      | lint, on the CPU time nothing else wants (SCHED_IDLE): the cluster tests leave the
#        cores idle about a tenth of their time, waiting on their jobs, and lint (about two
#        minutes of CPU, none of it timed) fits there instead of holding up stage 1; what is
#        left of it when the others end goes on at the normal priority.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
# On CI a missing container cluster must fail the run, not skip its tests.
export TORCHHERD_REQUIRE_CLUSTER=1
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/torchherd-test.XXXXXX")
declare -A PIDS=()
FAILED=()

# start NAME COMMAND...: run COMMAND in the background, its output to $LOGS/NAME.log.
start() {
  local name=$1
  shift
  echo "== $name: started $(date +%T)"
  "$@" >"$LOGS/$name.log" 2>&1 &
  PIDS[$name]=$!
}

# finish NAME...: wait for each, print its log, remember a failure.
finish() {
  local name rc
  for name in "$@"; do
    rc=0
    wait "${PIDS[$name]}" || rc=$?
    echo "== $name: exit $rc at $(date +%T)"
    cat "$LOGS/$name.log"
    ((rc == 0)) || FAILED+=("$name (exit $rc)")
  done
}

verdict() {
  if ((${#FAILED[@]})); then
    printf '== FAILED: %s\n' "${FAILED[@]}"
    exit 1
  fi
}

trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

start unit python -m pytest -q -p no:cacheprovider -n 2 tests/unit
if [ "${1:-}" = "quick" ]; then
  start lint scripts/lint.sh
  finish lint unit
  verdict
  python -m pytest -q tests/integration/test_launch.py -k three_nodes
  exit 0
fi
start image python -m tests.cluster.testbed build
finish image unit
verdict

# In a session of its own (setsid), so that what is left of it can be found and given the
# normal priority back once nothing of the suite wants the CPU (below): on a machine that other
# work keeps busy, SCHED_IDLE alone could hold it back for as long as that work lasts.
start lint setsid chrt --idle 0 scripts/lint.sh

start cluster python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup \
  --durations=30 --junitxml="$LOGS/cluster.xml" tests/integration
start molecule nice -n 10 scripts/molecule.sh
finish cluster molecule
for pid in $(ps -o pid= -s "${PIDS[lint]}" 2>/dev/null || true); do
  chrt --other -a -p 0 "$pid" >/dev/null 2>&1 || true
done
finish lint
if [ -s "$LOGS/cluster.xml" ]; then
  python scripts/slowest.py "$LOGS/cluster.xml" 30 >tests/slowest.md
fi
verdict
