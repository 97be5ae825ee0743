#!/usr/bin/env bash
# Molecule scenarios of the collection's roles (molecule/), on container nodes of the project's
# test harness (tests/cluster/testbed.py). Without arguments: `molecule test --all`; otherwise
# the arguments go to molecule, e.g. `scripts/molecule.sh converge -s sync`.
# Needs the venv with the test extras (scripts/setup.sh) and the node image
# (scripts/setup.sh --cluster); all six scenarios take 3.5 to 6 minutes on 2 shared cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
# A venv made before molecule joined the test extras gets it now.
python -c 'import molecule' 2>/dev/null || pip install -q -e '.[test]'
# The same settings that molecule/config.yml hands to Ansible, for molecule's own calls to
# ansible-config and ansible-inventory.
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
export ANSIBLE_COLLECTIONS_PATH="$PWD/collection"
export CONTAINERS_CONF="$PWD/tests/cluster/containers.conf"
# Molecule's logs, colour-free when not on a terminal.
[ -t 1 ] || export NO_COLOR=1

if (($# == 0)); then
  set -- test --all
fi
exec molecule --base-config molecule/config.yml "$@"
