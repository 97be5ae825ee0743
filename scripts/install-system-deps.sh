#!/usr/bin/env bash
# Installs the Debian packages the container test cluster needs (tests/cluster/testbed.py).
# Idempotent and fast when everything is present: apt-get only runs for missing packages.
# Writes no global container configuration: the harness points CONTAINERS_CONF at
# tests/cluster/containers.conf for every podman call.
set -euo pipefail

packages=(
  podman runc fuse-overlayfs slirp4netns uidmap debootstrap rsync
  openssh-client pdsh
)

missing=()
for pkg in "${packages[@]}"; do
  # dpkg -s succeeds for removed-but-configured packages too, so check the status line.
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
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
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
echo "install-system-deps: done"
