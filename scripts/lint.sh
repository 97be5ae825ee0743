#!/usr/bin/env bash
# Lint: ruff, ansible-lint (production profile, settings in .ansible-lint), Python 3.8
# compatibility of the code that runs on the nodes, and ansible-test sanity of the collection.
# Needs the venv of scripts/setup.sh. The first run installs what the checks need from PyPI
# (about 2 minutes); later runs take about 30 seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
COLLECTION=collection/ansible_collections/torchherd/cluster

echo "== ruff"
ruff check .

echo "== ansible-lint"
ansible-lint --profile production

# Modules and module_utils run on the nodes, where ansible-core 2.19 supports Python 3.8 and
# later; ansible-test below compiles them with the controller's 3.11 only. vermin finds newer
# syntax (match, ...) and newer standard library use (str.removeprefix, ...). Its guess at
# runtime `X | Y` unions is left off: it takes every bitwise or of two names for one.
echo "== python 3.8 compatibility of modules and module_utils"
python -c 'import vermin' 2>/dev/null || pip install -q vermin==1.9.2
vermin --target=3.8- --no-tips --violations --quiet \
  "$COLLECTION/plugins/modules" "$COLLECTION/plugins/module_utils"

# ansible-test bootstraps pip in each virtual environment it makes with a get-pip script from
# the Ansible project's CI file server, which this machine cannot reach. It takes the script from its
# cache when there; this stand-in does the same from PyPI: ensurepip, then pip installs the
# pinned pip (and anything else) that ansible-test asks for.
pip_version=$(python -c 'import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="3.11"))["pip"])')
get_pip=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
if [ ! -e "$get_pip" ]; then
  mkdir -p "$(dirname "$get_pip")"
  cat >"$get_pip" <<'EOF'
"""Stand-in for ansible-test's get-pip script, written by torchherd's scripts/lint.sh."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"],
                      stdout=subprocess.DEVNULL)
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
if "--no-setuptools" in sys.argv:
    subprocess.call([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
EOF
fi

# ansible-test sanity, without containers (no registry here): --venv runs it in a virtual
# environment of the controller's Python 3.11 that it makes under tests/output, and each test
# in its own cached one under ~/.ansible/test/venv, with the pinned tools (pylint, yamllint,
# validate-modules' voluptuous, ...) from PyPI. Every default test runs, except:
#   - compile and import for Python 3.8-3.10, 3.12 and 3.13 (the node Pythons): --python 3.11
#     limits them to the controller's, the only Python setup.sh provides; ansible-test cannot
#     fetch others without containers. vermin above covers 3.8 compatibility.
#   - pslint: the collection has no PowerShell, and pwsh is neither on PyPI nor in Debian.
# shellcheck runs but has nothing to check: the collection has no shell scripts (ansible-test
# skips it with a warning where the shellcheck binary is missing). changelog lints the
# collection's changelogs/ (fragments and changelog.yaml, antsibull-changelog's layout).
# Known exceptions, each with its reason, are in tests/sanity/ignore-2.19.txt.
echo "== ansible-test sanity"
(cd "$COLLECTION" && ansible-test sanity --venv --python 3.11 --skip-test pslint)
