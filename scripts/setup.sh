#!/usr/bin/env bash
# Installs what torchherd needs on this machine, idempotently: a venv with torch (CPU build),
# ansible-core, ansible-runner and the driver; rsync. With --cluster also the container
# tooling and the test node image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v rsync >/dev/null; then
  apt-get update -qq && apt-get install -y -qq rsync openssh-client >/dev/null
fi
# --cluster and --cluster-tools: the container tooling (apt) and the node image's base
# (debootstrap, with the system's python3: the testbed needs only the standard library) in the
# background, beside the venv's installs below (pip), which need neither: a fresh setup on 2
# cores waited for each in turn.
behind=
case "${1:-}" in
  --cluster | --cluster-tools)
    behind_log=$(mktemp "${TMPDIR:-/tmp}/torchherd-setup.XXXXXX")
    { scripts/install-system-deps.sh && "$PY" -m tests.cluster.testbed base; } >"$behind_log" 2>&1 &
    behind=$!
    # Where a step below fails, apt is not cut off mid-install: setup ends when it does.
    trap 'if [ -n "$behind" ]; then wait "$behind" || true; cat "$behind_log"; rm -f "$behind_log"; fi' EXIT
    ;;
esac
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip byte-compiles what it installs one file at a time; --no-compile, then compile() below does
# it on every core at once (a fresh setup on 2 cores: 61 s before, 55 s so).
# Where PYTHONDONTWRITEBYTECODE is set, nothing is compiled on import: the files must be now.
compiled=
compile() {
  [ -n "$compiled" ] || return 0
  # As pip does, a file that is not Python 3.11 (torch ships a few 3.12 test helpers) is left
  # as it is.
  local site
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv/bin/python -m compileall -q -j 0 "$site" >/dev/null || true
}
# torch is pinned: any other version would pull gigabytes of CUDA packages.
if ! .venv/bin/python -c 'import torch, numpy; assert torch.__version__.startswith("2.13.0")' 2>/dev/null; then
  .venv/bin/pip install -q --no-compile torch==2.13.0 numpy
  compiled=1
fi
# Every runtime and test dependency is named here, so that a venv made before one was added
# gets it too.
if ! .venv/bin/python -c 'import driver, ansible_runner, argcomplete, pathspec, pytest, xdist, ruff, ansiblelint, molecule, jsonschema, ansible_builder, bindep, twine, trove_classifiers, selenium
assert tuple(map(int, pytest.__version__.split(".")[:2])) < (9, 2)
import importlib.metadata, pathlib  # installed as the checkout says (VERSION changes on a release)
assert importlib.metadata.version("torchherd") == pathlib.Path("VERSION").read_text().strip()' 2>/dev/null; then
  .venv/bin/pip install -q --no-compile -e '.[test]'
  compiled=1
fi
compile
if [ -n "$behind" ]; then
  rc=0
  wait "$behind" || rc=$?
  behind=
  cat "$behind_log"
  rm -f "$behind_log"
  ((rc == 0)) || { echo "setup: the container tooling or the base image failed (exit $rc)" >&2; exit "$rc"; }
fi
# --cluster: also the node image; --cluster-tools: the tooling and the base image only
# (scripts/test.sh builds the node image beside the unit tests, which need none).
if [ "${1:-}" = "--cluster" ]; then
  .venv/bin/python -m tests.cluster.testbed build
fi
