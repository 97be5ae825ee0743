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
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch is pinned: any other version would pull gigabytes of CUDA packages.
if ! .venv/bin/python -c 'import torch, numpy; assert torch.__version__.startswith("2.13.0")' 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0 numpy
fi
# Every runtime and test dependency is named here, so that a venv made before one was added
# gets it too.
if ! .venv/bin/python -c 'import driver, ansible_runner, argcomplete, pathspec, pytest, ruff, ansiblelint, molecule, jsonschema' 2>/dev/null; then
  .venv/bin/pip install -q -e '.[test]'
fi
if [ "${1:-}" = "--cluster" ]; then
  scripts/install-system-deps.sh
  .venv/bin/python -m tests.cluster.testbed build
fi
