#!/usr/bin/env bash
# Installs the Debian packages the container test cluster needs (tests/cluster/testbed.py),
# tmux for the terminal test (tests/integration/test_terminal.py), docker-registry for the
# container pull test (tests/integration/test_container.py), and chromium with its driver for
# the page of `torchherd show` in a real browser (tests/integration/browser.py).
# Idempotent and fast when everything is present: apt-get only runs for missing packages.
# Writes no global container configuration: the harness points CONTAINERS_CONF at
# tests/cluster/containers.conf for every podman call.
set -euo pipefail

packages=(
  podman runc fuse-overlayfs slirp4netns uidmap debootstrap rsync
  openssh-client pdsh tmux docker-registry chromium chromium-driver
)

missing=()
for pkg in "${packages[@]}"; do
  # Like `dpkg -s`, but a removed package whose config files remain counts as missing.
  if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-system-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if ((EUID != 0)); then
  sudo_cmd=(sudo)
fi

echo "install-system-deps: installing ${missing[*]}"
# Through env: sudo drops the caller's environment.
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
echo "install-system-deps: done"
