#!/usr/bin/env bash
# The whole suite (default) or the quick loop (`quick`: lint, unit tests, one cluster launch).
# Run through `make test` / `make check`, which install everything first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
# On CI a missing container cluster must fail the run, not skip its tests.
export TORCHHERD_REQUIRE_CLUSTER=1

echo "== lint (ruff, ansible-lint, python 3.8 check, ansible-test sanity)"
scripts/lint.sh
echo "== unit tests"
python -m pytest -q tests/unit
if [ "${1:-}" = "quick" ]; then
  python -m pytest -q tests/integration/test_launch.py -k three_nodes
  exit 0
fi
echo "== cluster tests"
python -m pytest -q tests/integration --durations=30
echo "== molecule"
scripts/molecule.sh
