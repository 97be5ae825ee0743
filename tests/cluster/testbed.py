"""A real test cluster on one machine: podman containers running systemd and sshd as nodes.

Each node has its own filesystem, hostname, processes and fixed IP on a dedicated podman
network, and is reached from this host over real SSH, exactly as the driver reaches real
machines. The image is built locally (debootstrap base, torch from a host-side wheelhouse)
because no container registry is reachable; see /work/shared/TESTBED.md for the traps.

    python -m tests.cluster.testbed build
    python -m tests.cluster.testbed up demo [-n 3] [--subnet-index 5] [--extra outsider]
        [--data-network] [--no-ipv6 INDEX]
    python -m tests.cluster.testbed status [demo] [--json]
    python -m tests.cluster.testbed down demo

State (wheelhouse, rootfs while building, SSH key, inventories) lives outside the repository
in TORCHHERD_TESTBED_DIR, default /var/tmp/torchherd-testbed.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
CONTAINERS_CONF = HERE / "containers.conf"
CONTAINERFILE = HERE / "Containerfile"

BASE_IMAGE = "localhost/torchherd-node-base:latest"
IMAGE_REPO = "localhost/torchherd-node"
# The image jobs run in on container_runtime nodes, and where those nodes see its store.
JOB_IMAGE_REPO = "localhost/torchherd-job"
JOB_IMAGES_MOUNT = "/var/lib/torchherd-images"
DEBIAN_SUITE = "bookworm"
# The node's /usr/bin/python3 (bookworm: 3.11) decides which wheels fit, not the host's python.
NODE_PYTHON_VERSION = "3.11"
NODE_GLIBC_MINOR = 36
# accelerate and DeepSpeed: the nodes can run every launcher. DeepSpeed comes as source only:
# its wheel is built on the host (SOURCE_WHEELS) against the host's torch, its dependencies are
# downloaded as wheels. (On CPU its first init compiles a C++ extension; the image does that once
# at build time, see the Containerfile.) py-spy (a static binary in a wheel): torchherd's stacks
# collection reads every rank's Python stack with it.
WHEEL_REQUIREMENTS = (
    "torch==2.13.0", "numpy", "accelerate==1.15.0",
    "hjson", "ninja", "py-cpuinfo", "pydantic", "msgpack", "einops", "psutil", "tqdm",
    "packaging", "py-spy==0.4.3",
)
SOURCE_WHEELS = ("deepspeed==0.19.8",)

NODES_GROUP = "torchherd_nodes"
EXTRAS_GROUP = "outsiders"
LABEL_CLUSTER = "io.torchherd.testbed.cluster"
LABEL_ROLE = "io.torchherd.testbed.role"
LABEL_INDEX = "io.torchherd.testbed.index"
LABEL_IP = "io.torchherd.testbed.ip"
LABEL_DATA_IP = "io.torchherd.testbed.data-ip"
LABEL_MGMT_IF = "io.torchherd.testbed.mgmt-if"
LABEL_DATA_IF = "io.torchherd.testbed.data-if"
# On a data network: whose it is. Cluster "a"'s data network torchherd-a-data has the name of
# cluster "a-data"'s management network; only the label tells them apart.
LABEL_DATA_NETWORK_OF = "io.torchherd.testbed.data-network-of"
LABEL_HASH = "io.torchherd.testbed.containerfile-sha256"

# Interface names of data-network nodes, by node index (cycling): real clusters name their
# NICs differently from machine to machine, so a job must not assume one name everywhere. The
# first three nodes share neither a management nor a data interface name.
MGMT_IFNAMES = ("eth0", "mgmt0", "eno1")
DATA_IFNAMES = ("data0", "ib0", "enp65s0f1")
# The nodes' own nftables table that makes the management network carry SSH only.
MGMT_FIREWALL_TABLE = "testbed_mgmt"
# Management and data networks of test clusters; each range has a blackhole on the host.
TESTBED_RANGES = ("10.66.0.0/16", "10.67.0.0/16")

FIRST_NODE_HOST = 10
FIRST_EXTRA_HOST = 200
MAX_SUBNET_INDEX = 155  # third octet 100 + index must stay <= 255
# Fixed subnet indexes (tests' shared clusters) stay below this; up() picks free ones above.
AUTO_SUBNET_START = 20
SSH_OPTIONS = (
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
)  # fmt: skip
# Harmless noise of `podman exec` on hosts without a syslog socket; dropped so that callers
# can compare a node's stderr.
_PODMAN_NOISE = re.compile(r"^.*failed to connect to syslog.*\n?", re.MULTILINE)
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")

T = TypeVar("T")


class TestbedError(RuntimeError):
    """The test cluster could not be built, started or used."""

    __test__ = False  # not a pytest test class despite the name


class CommandError(TestbedError):
    def __init__(self, argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.argv = list(argv)
        self.result = result
        stderr = (result.stderr or "").strip()
        stdout = (result.stdout or "").strip()
        detail = stderr[-4000:] or stdout[-4000:] or "(no output)"
        super().__init__(
            f"command failed with exit code {result.returncode}: {shlex.join(self.argv)}\n{detail}"
        )


def state_dir() -> Path:
    return Path(os.environ.get("TORCHHERD_TESTBED_DIR", "/var/tmp/torchherd-testbed"))


def _log(message: str) -> None:
    print(f"[testbed] {message}", file=sys.stderr, flush=True)


def _env() -> dict[str, str]:
    # The project's containers.conf, never the machine's: see the comments in that file.
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = None,
    stream: bool = False,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv with the testbed environment; stream=True sends its output to stderr live,
    input (if any) goes to its stdin."""
    try:
        result = subprocess.run(
            list(argv),
            env=_env(),
            stdin=None if input is not None else subprocess.DEVNULL,
            input=input,
            stdout=sys.stderr if stream else subprocess.PIPE,
            stderr=sys.stderr if stream else subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise TestbedError(
            f"{argv[0]} not found: run scripts/install-system-deps.sh first"
        ) from exc
    if check and result.returncode != 0:
        raise CommandError(argv, result)
    return result


def podman(
    *args: str, check: bool = True, stream: bool = False
) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], check=check, stream=stream)


def _timed(step: str, action: Callable[[], T]) -> T:
    start = time.monotonic()
    value = action()
    _log(f"{step}: {time.monotonic() - start:.1f} s")
    return value


@contextmanager
def _locked(name: str) -> Iterator[None]:
    # Several pytest sessions share this machine: they must not debootstrap twice, pick the
    # same subnet, or recreate a cluster that another one is using.
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / f".{name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for {name}, held by another process")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def reserve(cluster: str) -> AbstractContextManager[None]:
    """Hold cluster `name` against other processes while using it: a second test session on
    this machine then waits instead of recreating the cluster under the first one's feet.
    Released when the process dies."""
    return _locked(f"cluster-{cluster}")


# ---------------------------------------------------------------------------------------------
# Image


def image_tag() -> str:
    """The node image tag for the current Containerfile: an edit there means a new tag."""
    return f"{IMAGE_REPO}:{_containerfile_hash()[:12]}"


def _containerfile_hash() -> str:
    return hashlib.sha256(CONTAINERFILE.read_bytes()).hexdigest()


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def build(*, force: bool = False, stream: bool = False) -> str:
    """Build the node image unless the one for this Containerfile exists; returns its tag."""
    tag = image_tag()
    with _locked("build"):
        if not force and image_exists(tag):
            _log(f"image {tag} present")
            return tag
        total = time.monotonic()
        wheelhouse = _timed("wheelhouse", ensure_wheelhouse)
        _timed("base image", lambda: ensure_base_image(stream=stream))
        _timed("node image", lambda: _build_node_image(tag, wheelhouse, stream=stream))
        _log(f"build total: {time.monotonic() - total:.1f} s")
    return tag


def build_base(*, stream: bool = False) -> None:
    """Only the base image (no-op when present): it needs neither torch nor the wheelhouse, so
    scripts/setup.sh makes it while the venv is installed."""
    with _locked("build"):
        _timed("base image", lambda: ensure_base_image(stream=stream))


def ensure_wheelhouse() -> Path:
    """Download torch and numpy wheels for the nodes' python into the state dir, once."""
    wheelhouse = state_dir() / "wheelhouse"
    marker = wheelhouse / ".complete"
    wanted = "\n".join((*WHEEL_REQUIREMENTS, *SOURCE_WHEELS))
    if marker.is_file() and marker.read_text() == wanted:
        return wheelhouse
    partial = state_dir() / "wheelhouse.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    target = [
        "--only-binary=:all:",
        "--implementation", "cp",
        "--python-version", NODE_PYTHON_VERSION,
        # pip takes each --platform literally, not as a floor: name every glibc the node has
        # (py-spy's wheel is manylinux_2_5 only).
        *(f"--platform=manylinux_2_{minor}_x86_64" for minor in range(5, NODE_GLIBC_MINOR + 1)),
    ]  # fmt: skip
    pip = [sys.executable, "-m", "pip", "download", "--dest", str(partial), *target]
    # torch alone first: a CUDA build would drag in gigabytes of nvidia packages, so stop
    # before resolving its dependencies if pip found anything but the local CPU build.
    torch_requirement = next(r for r in WHEEL_REQUIREMENTS if r.startswith("torch"))
    run([*pip, "--no-deps", torch_requirement])
    _check_torch_wheel(partial)
    run([*pip, *WHEEL_REQUIREMENTS])
    _check_torch_wheel(partial)
    # Pure Python once built; without build isolation, so that its setup finds the host's torch
    # instead of installing one of its own.
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(partial), *SOURCE_WHEELS])
    shutil.rmtree(wheelhouse, ignore_errors=True)
    partial.rename(wheelhouse)
    marker.write_text(wanted)
    return wheelhouse


def _check_torch_wheel(wheelhouse: Path) -> None:
    wheels = sorted(wheelhouse.glob("torch-*.whl"))
    if len(wheels) != 1:
        raise TestbedError(f"expected one torch wheel in {wheelhouse}, found {wheels}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        metadata_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(metadata_name).decode()
    cuda = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: nvidia")]
    if cuda or any(wheelhouse.glob("nvidia_*.whl")):
        raise TestbedError(
            f"pip resolved {wheels[0].name}, a CUDA build of torch ({', '.join(cuda[:3])}...); "
            "the nodes need the CPU build: make pip find it (find-links or index) and retry"
        )


def _host_mirror() -> str | None:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources), if any."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "URIs:" and words[1].rstrip("/").endswith("/debian"):
                return words[1]
            if len(words) >= 3 and words[0] == "deb" and words[2].startswith(DEBIAN_SUITE):
                return words[1]
    return None


def ensure_base_image(*, stream: bool = False) -> None:
    """debootstrap a minimal bookworm and import it: no registry can provide a base image."""
    if image_exists(BASE_IMAGE):
        return
    if os.geteuid() != 0:
        raise TestbedError("debootstrap of the base image needs root")
    rootfs = state_dir() / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    mirror = os.environ.get("TORCHHERD_DEBIAN_MIRROR") or _host_mirror()
    try:
        # Without a mirror argument debootstrap uses its own default.
        run(["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(rootfs),
             *([mirror] if mirror else [])], stream=stream)
        _import_rootfs(rootfs, BASE_IMAGE)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def _import_rootfs(rootfs: Path, ref: str) -> None:
    tar_argv = ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."]
    import_argv = ["podman", "import", "-", ref]
    with subprocess.Popen(tar_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tar:
        assert tar.stdout is not None
        imported = subprocess.run(
            import_argv, stdin=tar.stdout, capture_output=True, text=True, env=_env(), check=False
        )
        tar.stdout.close()
        tar_stderr = tar.stderr.read().decode() if tar.stderr else ""
    if tar.returncode != 0:
        raise CommandError(
            tar_argv, subprocess.CompletedProcess(tar_argv, tar.returncode, "", tar_stderr)
        )
    if imported.returncode != 0:
        raise CommandError(import_argv, imported)


def _build_node_image(tag: str, wheelhouse: Path, *, stream: bool = False) -> None:
    podman(
        "build",
        # The host's network for the RUN steps (apt, pip): no NAT of podman's bridge on the way,
        # which a host whose legacy iptables nat table sits beside the nft one never applies.
        "--network", "host",
        "--file", str(CONTAINERFILE),
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
        "--volume", f"{wheelhouse}:/wheelhouse:ro",
        "--label", f"{LABEL_HASH}={_containerfile_hash()}",
        "--tag", tag,
        "--tag", f"{IMAGE_REPO}:latest",
        str(HERE),
        stream=stream,
    )  # fmt: skip
    # Older tags are 1.3 GB each; one still used by a running cluster stays (rmi fails).
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO).stdout.split()
    for old in listed:
        if old not in (tag, f"{IMAGE_REPO}:latest"):
            podman("rmi", old, check=False)


# ---------------------------------------------------------------------------------------------
# Cluster


@dataclass(frozen=True)
class Node:
    """A container: ip is its management address (SSH, ansible_host); a node of a cluster with
    a data network also has data_ip on data_if, the address other nodes reach it at."""

    name: str
    ip: str
    data_ip: str | None = None
    mgmt_if: str = "eth0"
    data_if: str | None = None

    @property
    def fabric_if(self) -> str:
        """The interface node-to-node traffic uses: the data one, else the management one."""
        return self.data_if or self.mgmt_if


NodeRef = Node | str | int


@dataclass
class Cluster:
    name: str
    nodes: list[Node]
    inventory: Path
    key: Path
    extras: list[Node] = field(default_factory=list)

    @property
    def network(self) -> str:
        return network_name(self.name)

    @property
    def data_network(self) -> str | None:
        """The data network's podman name, None for a cluster without one."""
        return data_network_name(self.name) if any(n.data_ip for n in self.nodes) else None

    def node(self, ref: NodeRef) -> Node:
        """A node or extra container by Node, index into nodes, or (short or full) name."""
        if isinstance(ref, Node):
            return ref
        if isinstance(ref, int):
            return self.nodes[ref]
        for candidate in (*self.nodes, *self.extras):
            if ref in (candidate.name, candidate.name.removeprefix(f"{self.name}-")):
                return candidate
        raise KeyError(f"cluster {self.name} has no node {ref!r}")

    def exec(
        self, node: NodeRef, argv: Sequence[str], check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the node with podman exec (works whatever state sshd is in)."""
        result = run(["podman", "exec", self.node(node).name, *argv], check=False, timeout=timeout)
        result.stderr = _PODMAN_NOISE.sub("", result.stderr)
        if check and result.returncode != 0:
            raise CommandError(result.args, result)
        return result

    def ssh_argv(self, node: NodeRef, *, connect_timeout: int = 5) -> list[str]:
        """The ssh command line up to the remote command, for callers that need a Popen."""
        return [
            "ssh", "-i", str(self.key), *SSH_OPTIONS,
            "-o", f"ConnectTimeout={connect_timeout}",
            f"root@{self.node(node).ip}",
        ]  # fmt: skip

    def ssh(
        self, node: NodeRef, argv: Sequence[str], check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run argv on the node over real SSH (quoted: the remote side runs it via a shell)."""
        return run([*self.ssh_argv(node), shlex.join(argv)], check=check, timeout=timeout)

    def stop_sshd(self, node: NodeRef) -> None:
        """Make new SSH connections to the node fail with "connection refused"."""
        self.exec(node, ["systemctl", "stop", "ssh.socket", "ssh.service"])

    def start_sshd(self, node: NodeRef) -> None:
        self.exec(node, ["systemctl", "start", "ssh.service"])

    def kill(self, node: NodeRef) -> None:
        """SIGKILL the whole node, as if the machine lost power; returns once it is down."""
        name = self.node(node).name
        podman("kill", name)
        podman("wait", name)

    def pids(self, node: NodeRef, pattern: str) -> list[int]:
        """PIDs of the node's processes whose full command line matches the regex pattern."""
        result = self.exec(node, ["pgrep", "-f", pattern], check=False)
        if result.returncode not in (0, 1):  # 1 means no match
            raise CommandError(result.args, result)
        return [int(pid) for pid in result.stdout.split()]

    def read_file(self, node: NodeRef, path: str) -> str:
        return self.exec(node, ["cat", path]).stdout

    def open_management(self, node: NodeRef) -> None:
        """Let the data-network node's management interface carry any traffic (the job's too),
        not SSH alone; close_management() puts the SSH-only rules back. Fine on a node without
        them."""
        self.exec(node, ["nft", "delete", "table", "inet", MGMT_FIREWALL_TABLE], check=False)

    def close_management(self, node: NodeRef) -> None:
        target = self.node(node)
        if target.data_ip:
            self.exec(target, ["nft", "delete", "table", "inet", MGMT_FIREWALL_TABLE],
                      check=False)
            _configure_data_node(target)

    def throttle(self, node: NodeRef, rate: str = "50mbit") -> None:
        """Shape what the node sends on its data interface (the management one without a data
        network) to rate, e.g. "50mbit": a slow interconnect. Only egress is shaped, so throttle
        the sending side. unthrottle() undoes it."""
        target = self.node(node)
        self.exec(target, ["tc", "qdisc", "replace", "dev", target.fabric_if, "root", "tbf",
                           "rate", rate, "burst", "32kbit", "latency", "400ms"])  # fmt: skip

    def unthrottle(self, node: NodeRef) -> None:
        """Back to the interface's default queueing; fine if it was not throttled."""
        target = self.node(node)
        argv = ["tc", "qdisc", "del", "dev", target.fabric_if, "root"]
        result = self.exec(target, argv, check=False)
        # tc's answer when there is no root qdisc of ours to delete.
        if result.returncode != 0 and "handle of zero" not in result.stderr:
            raise CommandError(result.args, result)

    def write_inventory(
        self, host_vars: Mapping[str, Mapping[str, str]] | None = None, path: Path | None = None
    ) -> Path:
        """Write an inventory like the cluster's own plus per-host variables (keyed by a node's
        full or short name, e.g. {"node1": {"torchherd_socket_ifname": "ib0"}}) and return its
        path: by default a file next to the default inventory, named after its content so that
        tests asking for different variables never overwrite each other's."""
        by_name = {self.node(ref).name: dict(v) for ref, v in (host_vars or {}).items()}
        text = render_inventory(
            self.nodes, self.extras, self.key, self.inventory.parent / "known_hosts", by_name
        )
        if path is None:
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            path = self.inventory.with_name(f"inventory-{digest}.ini")
        path.write_text(text)
        return path

    def wait_ssh(self, timeout: float = 60.0) -> None:
        """Wait until every node and extra accepts a real SSH login."""
        deadline = time.monotonic() + timeout
        pending = {node.name: node for node in (*self.nodes, *self.extras)}
        last_error: dict[str, str] = {}
        while pending:
            for name, node in list(pending.items()):
                result = run([*self.ssh_argv(node, connect_timeout=2), "true"], check=False)
                if result.returncode == 0:
                    del pending[name]
                else:
                    last_error[name] = result.stderr.strip() or f"exit code {result.returncode}"
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TestbedError(
                    f"no SSH login within {timeout:.0f} s on: "
                    + "; ".join(self._diagnose(node, last_error[n]) for n, node in pending.items())
                )
            time.sleep(0.2)

    def _diagnose(self, node: Node, ssh_error: str) -> str:
        state = podman("inspect", "--format", "{{.State.Status}}", node.name, check=False)
        container = state.stdout.strip() or "missing"
        detail = f"{node.name} ({node.ip}): ssh said {ssh_error!r}; container {container}"
        if container != "running":
            return detail
        boot = self.exec(node, ["systemctl", "is-system-running"], check=False).stdout.strip()
        failed = self.exec(node, ["systemctl", "--failed", "--no-legend", "--plain"], check=False)
        units = " ".join(line.split()[0] for line in failed.stdout.splitlines() if line.strip())
        return f"{detail}, systemd {boot or 'unknown'}, failed units: {units or 'none'}"

    def down(self) -> None:
        down(self.name)


def network_name(cluster: str) -> str:
    return f"torchherd-{cluster}"


def data_network_name(cluster: str) -> str:
    return f"torchherd-{cluster}-data"


def subnet_prefix(subnet_index: int) -> str:
    """First three octets of a cluster's /24: 10.66.(100+index); 10.88/16 is podman's own."""
    if not 0 <= subnet_index <= MAX_SUBNET_INDEX:
        raise ValueError(f"subnet_index must be in 0..{MAX_SUBNET_INDEX}, got {subnet_index}")
    return f"10.66.{100 + subnet_index}"


def data_subnet_prefix(subnet_index: int) -> str:
    """First three octets of a cluster's data /24: 10.67.(100+index), next to its management
    one, so that a node's host number is the same on both."""
    return subnet_prefix(subnet_index).replace("10.66.", "10.67.", 1)


def free_subnet_index(start: int = AUTO_SUBNET_START, *, own: str | None = None) -> int:
    """The first subnet index from start on whose management and data subnets no podman
    network uses, except the networks of cluster `own`, which up() recreates anyway."""
    networks = json.loads(podman("network", "ls", "--format", "json").stdout or "[]")
    own_networks = {network_name(own), data_network_name(own)} if own else set()
    used = {
        subnet.get("subnet")
        for network in networks
        if network.get("name") not in own_networks
        for subnet in network.get("subnets") or []
    }
    for index in range(start, MAX_SUBNET_INDEX + 1):
        wanted = {f"{subnet_prefix(index)}.0/24", f"{data_subnet_prefix(index)}.0/24"}
        if not wanted & used:
            return index
    raise TestbedError(f"every subnet index from {start} to {MAX_SUBNET_INDEX} is in use")


def mac_for(ip: str) -> str:
    # Fixed per IP (locally administered): a recreated node otherwise gets a new random MAC
    # and stays unreachable ~30 s while the host and the other nodes keep the old ARP entry.
    return "02:42:" + ":".join(f"{int(octet):02x}" for octet in ip.split("."))


def key_path() -> Path:
    return state_dir() / "id_ed25519"


def ensure_key() -> Path:
    """The harness's SSH key (ed25519, no passphrase), generated once in the state dir."""
    key = key_path()
    with _locked("key"):
        if not key.is_file() or not key.with_suffix(".pub").is_file():
            key.unlink(missing_ok=True)
            key.with_suffix(".pub").unlink(missing_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testbed", "-f", str(key)])
        # Mounted into the nodes as an AuthorizedKeysFile: sshd's StrictModes wants it
        # not writable by group or others.
        key.with_suffix(".pub").chmod(0o644)
    return key


# The kernel's ARP table is one for all network namespaces: every node of every cluster keeps an
# entry per peer it talks to. A 32-node gloo job (32 x 31 entries) alone overflows the default
# gc_thresh3 of 1024 ("arp_cache: neighbor table overflow"), and gloo's connects then fail with
# "No route to host". Real nodes each have a table of their own.
NEIGHBOUR_TABLE = {"gc_thresh1": 4096, "gc_thresh2": 16384, "gc_thresh3": 32768}
# Every node's systemd takes inotify instances of the host's user root (one limit for all
# containers, 128 by default): from about 40 nodes on, the later nodes' .path units fail,
# systemd stays "initializing" and sshd never starts (a 64-node cluster did not come up).
INOTIFY = {"max_user_instances": 8192, "max_user_watches": 1048576}


def _room_in_the_host_tables() -> None:
    """Raise the host's ARP table limits to NEIGHBOUR_TABLE, and its inotify limits to INOTIFY,
    where they are lower."""
    wanted_values = [(Path(f"/proc/sys/net/ipv4/neigh/default/{key}"), wanted)
                     for key, wanted in NEIGHBOUR_TABLE.items()]
    wanted_values += [(Path(f"/proc/sys/fs/inotify/{key}"), wanted)
                      for key, wanted in INOTIFY.items()]
    for path, wanted in wanted_values:
        try:
            if int(path.read_text()) < wanted:
                path.write_text(f"{wanted}\n")
        except (OSError, ValueError):
            pass  # not root, or no such file: the clusters stay small enough


def _blackhole_testbed_range() -> None:
    """Traffic for a test node whose network is gone must die here, never leave the machine.

    When every container of a network is down, podman removes its bridge and 10.66.x (or a data
    network's 10.67.x) would follow the default route out. Each /16 blackhole loses to a live
    bridge's /24."""
    for testbed_range in TESTBED_RANGES:
        run(["ip", "route", "replace", "blackhole", testbed_range], check=False)


def up(
    name: str,
    n: int,
    subnet_index: int | None = None,
    *,
    extra: Sequence[str] = (),
    timeout: float = 60.0,
    data_network: bool = False,
    no_ipv6: Sequence[int] = (),
    container_runtime: bool = False,
) -> Cluster:
    """Start (or recreate) cluster `name`: n nodes <name>-node<i> at 10.66.(100+idx).(10+i),
    plus extra containers <name>-<extra> at .200, .201, ... outside the node group.
    subnet_index None picks the first free one from AUTO_SUBNET_START.

    data_network: the nodes (not the extras) also get 10.67.(100+idx).(10+i) on a second,
    internal network, the inventory's torchherd_address; interface names differ from node to
    node (MGMT_IFNAMES, DATA_IFNAMES), and the management network carries SSH only (see
    _configure_data_node). no_ipv6: indexes of nodes started with IPv6 disabled.

    container_runtime: the nodes run podman (jobs in an image): they start privileged, each with
    its own container storage on a host directory and the job images (job_images) in a shared
    read-only store."""
    if not _NAME_RE.match(name):
        raise ValueError(f"cluster name must match {_NAME_RE.pattern}, got {name!r}")
    if not 1 <= n <= FIRST_EXTRA_HOST - FIRST_NODE_HOST:
        raise ValueError(f"n must be in 1..{FIRST_EXTRA_HOST - FIRST_NODE_HOST}, got {n}")
    for short in extra:
        if not _NAME_RE.match(short) or re.fullmatch(r"node\d+", short):
            raise ValueError(f"bad extra container name {short!r}")
    if not set(no_ipv6) <= set(range(n)):
        raise ValueError(f"no_ipv6 must hold node indexes in 0..{n - 1}, got {list(no_ipv6)}")
    if subnet_index is not None:
        subnet_prefix(subnet_index)  # validate before the build
    image = build()
    key = ensure_key()
    store = job_images()[0] if container_runtime else None
    start = time.monotonic()

    with _locked("networks"):
        _blackhole_testbed_range()
        _room_in_the_host_tables()
        if subnet_index is None:
            subnet_index = free_subnet_index(own=name)
        prefix = subnet_prefix(subnet_index)
        nodes = [_make_node(name, i, subnet_index, data_network) for i in range(n)]
        extras = [
            Node(f"{name}-{x}", f"{prefix}.{FIRST_EXTRA_HOST + j}") for j, x in enumerate(extra)
        ]
        _remove_containers(name, [node.name for node in (*nodes, *extras)])
        _ensure_network(network_name(name), f"{prefix}.0/24")
        if data_network:
            _ensure_data_network(name, f"{data_subnet_prefix(subnet_index)}.0/24")
        else:  # left by an earlier up() of this name with a data network
            _remove_data_network(name)
    cluster_dir = state_dir() / name
    cluster_dir.mkdir(parents=True, exist_ok=True)
    known_hosts = write_known_hosts(cluster_dir, [*nodes, *extras])
    for role, members in (("node", nodes), ("extra", extras)):
        for index, node in enumerate(members):
            without_ipv6 = role == "node" and index in no_ipv6
            _start_container(
                name, node, role, index, image, key, cluster_dir, no_ipv6=without_ipv6,
                store=store if role == "node" else None,
            )
    data_nodes = [node for node in nodes if node.data_ip is not None]
    if data_nodes:  # about 0.25 s each, mostly podman exec's start: side by side
        with ThreadPoolExecutor(len(data_nodes)) as pool:
            list(pool.map(_configure_data_node, data_nodes))

    inventory = cluster_dir / "inventory.ini"
    inventory.write_text(render_inventory(nodes, extras, key, known_hosts))
    cluster = Cluster(name=name, nodes=nodes, inventory=inventory, key=key, extras=extras)
    cluster.wait_ssh(timeout)
    _log(f"up {name}: {n} node(s) + {len(extras)} extra in {time.monotonic() - start:.1f} s")
    return cluster


def _make_node(cluster: str, index: int, subnet_index: int, data_network: bool) -> Node:
    host = FIRST_NODE_HOST + index
    name, ip = f"{cluster}-node{index}", f"{subnet_prefix(subnet_index)}.{host}"
    if not data_network:
        return Node(name, ip)
    return Node(
        name,
        ip,
        data_ip=f"{data_subnet_prefix(subnet_index)}.{host}",
        mgmt_if=MGMT_IFNAMES[index % len(MGMT_IFNAMES)],
        data_if=DATA_IFNAMES[index % len(DATA_IFNAMES)],
    )


def _network_args(cluster: str, node: Node) -> list[str]:
    if node.data_ip is None:
        mac = mac_for(node.ip)
        return ["--network", network_name(cluster), "--ip", node.ip, "--mac-address", mac]
    # podman names the interfaces (interface_name) before the node starts: renaming them inside
    # needs the link down, which drops the routes, and makes `podman network disconnect` fail.
    # mac_for differs between the two addresses, so the two MACs differ too.
    return [
        "--network", f"{network_name(cluster)}:ip={node.ip},mac={mac_for(node.ip)},"
                     f"interface_name={node.mgmt_if}",
        "--network", f"{data_network_name(cluster)}:ip={node.data_ip},mac={mac_for(node.data_ip)},"
                     f"interface_name={node.data_if}",
    ]  # fmt: skip


def _node_labels(node: Node) -> list[str]:
    labels = {LABEL_IP: node.ip}
    if node.data_ip is not None:
        labels |= {
            LABEL_DATA_IP: node.data_ip,
            LABEL_MGMT_IF: node.mgmt_if,
            LABEL_DATA_IF: node.data_if or "",
        }
    return [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]


def write_machine_id(cluster_dir: Path, name: str) -> Path:
    """The node's /etc/machine-id, written in cluster_dir. Without its own every node shares
    the host's and systemd boots "degraded"; derived from the name so that a recreated node
    keeps its identity."""
    machine_id = cluster_dir / f"{name}.machine-id"
    machine_id.write_text(hashlib.md5(f"torchherd-testbed/{name}".encode()).hexdigest() + "\n")
    return machine_id


def _start_container(
    cluster: str,
    node: Node,
    role: str,
    index: int,
    image: str,
    key: Path,
    cluster_dir: Path,
    *,
    no_ipv6: bool = False,
    store: Path | None = None,
) -> None:
    machine_id = write_machine_id(cluster_dir, node.name)
    podman(
        "run", "--detach",
        "--name", node.name,
        "--hostname", node.name,
        *_network_args(cluster, node),
        *(_runtime_args(node, cluster_dir, store) if store else
          ["--cap-add", "NET_ADMIN,NET_RAW"]),
        *(["--sysctl", "net.ipv6.conf.all.disable_ipv6=1",
           "--sysctl", "net.ipv6.conf.default.disable_ipv6=1"] if no_ipv6 else []),
        *(["--systemd", "false"] if store else ["--systemd", "always"]),
        "--volume", f"{machine_id}:/etc/machine-id:ro",
        "--volume", f"{key.with_suffix('.pub')}:/etc/ssh/torchherd_authorized_keys:ro",
        *host_key_volumes(node, cluster_dir),
        "--label", f"{LABEL_CLUSTER}={cluster}",
        "--label", f"{LABEL_ROLE}={role}",
        "--label", f"{LABEL_INDEX}={index}",
        *_node_labels(node),
        image,
        *(RUNTIME_NODE_COMMAND if store else ["/lib/systemd/systemd"]),
    )  # fmt: skip


# A node that runs podman runs sshd alone, without systemd: under systemd, podman gives the node
# a read-only cgroup tree of its own in which the node's podman cannot make its containers'
# cgroups (runc: "error mounting cgroup ... no such file or directory" on cgroups v1 hybrid).
RUNTIME_NODE_COMMAND = ["/bin/sh", "-c", "mkdir -p -m 0755 /run/sshd && exec /usr/sbin/sshd -D -e"]


def _runtime_args(node: Node, cluster_dir: Path, store: Path) -> list[str]:
    """A node that runs podman itself: privileged (its containers need mounts, namespaces and
    cgroups of their own), its container storage on a host directory (overlay cannot sit on the
    node's own overlay root) and the job images in the shared read-only store (the node
    image's /etc/containers/storage.conf names it)."""
    storage = cluster_dir / f"{node.name}-containers"
    storage.mkdir(parents=True, exist_ok=True)
    return ["--privileged",
            "--volume", f"{storage}:/var/lib/containers",
            "--volume", f"{store}:{JOB_IMAGES_MOUNT}:ro"]


def job_images() -> tuple[Path, str]:
    """The read-only image store the nodes of a container_runtime cluster share, and the job
    image in it: the node image itself (Python, torch and the launchers as on the nodes), named
    JOB_IMAGE_REPO:<the node image's tag>. Made once per node image (about 45 s: podman save
    to a directory, uncompressed, then pull from it into the store), kept in the state dir."""
    tag = image_tag().rsplit(":", 1)[1]
    ref = f"{JOB_IMAGE_REPO}:{tag}"
    root = state_dir() / "job-images"
    store, done = root / "storage", root / f".complete-{tag}"
    with _locked("job-images"):
        if done.is_file():
            return store, ref
        shutil.rmtree(root, ignore_errors=True)  # an older node image's store
        root.mkdir(parents=True)
        layout = root / "oci"
        start = time.monotonic()
        podman("save", "--uncompressed", "--format", "oci-dir", "--output", str(layout),
               image_tag())
        in_store = ["podman", "--root", str(store), "--runroot", str(root / "run"),
                    "--storage-driver", "overlay"]
        ident = run([*in_store, "pull", "--quiet", f"oci:{layout}"]).stdout.split()[-1]
        run([*in_store, "tag", ident, ref])
        shutil.rmtree(layout)
        done.write_text(ref + "\n")
        _log(f"job image {ref} in {store}: {time.monotonic() - start:.1f} s")
    return store, ref


# Run inside a data-network node with its data address as $1; the management firewall's
# ruleset comes on stdin. podman lists the node's own name with both addresses in /etc/hosts,
# in an order that varies; as the cluster's DNS does for every other node, the name must
# resolve to the management address alone (a job that binds to its hostname's address then
# meets the SSH-only management network, as on real clusters). /etc/hosts is a bind mount:
# rewritten in place, not replaced.
_CONFIGURE_DATA_NODE = r"""
set -eu
hosts=$(awk -v ip="$1" '$1 != ip' /etc/hosts)
printf '%s\n' "$hosts" > /etc/hosts
nft -f -
"""


def _configure_data_node(node: Node) -> None:
    """Make the node's hostname resolve to its management address only and let the management
    interface accept nothing but SSH: a job must use the data network, as on real clusters.

    Replies to connections the node opens itself (DNS from podman's resolver on the management
    gateway, above all) stay allowed: dropping them would stall every name lookup for seconds.
    Runs before SSH is waited for: podman exec needs neither sshd nor a finished boot."""
    ruleset = f"""table inet {MGMT_FIREWALL_TABLE} {{
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{node.mgmt_if}" tcp dport 22 accept
        iifname "{node.mgmt_if}" ct state established,related accept
        iifname "{node.mgmt_if}" drop
    }}
}}
"""
    argv = ["podman", "exec", "-i", node.name, "sh", "-c", _CONFIGURE_DATA_NODE, "sh"]
    run([*argv, node.data_ip or ""], input=ruleset)


def _remove_containers(cluster: str, names: Sequence[str]) -> None:
    listed = podman(
        "ps", "--all", "--filter", f"label={LABEL_CLUSTER}={cluster}", "--format", "{{.Names}}"
    ).stdout.split()
    targets = sorted({*listed, *names})
    if targets:
        podman("rm", "--force", "--ignore", "--time", "0", *targets)


def _inspect_network(network: str) -> dict[str, Any] | None:
    inspected = podman("network", "inspect", network, check=False)
    return json.loads(inspected.stdout)[0] if inspected.returncode == 0 else None


def _network_label(found: Mapping[str, Any], label: str) -> str | None:
    return (found.get("labels") or {}).get(label)


def _ensure_data_network(cluster: str, subnet: str) -> None:
    """The cluster's data network, as on real clusters: internal (no default route or NAT
    through it) and without DNS of its own, so that node names resolve to management addresses
    only (from the management network's DNS)."""
    network = data_network_name(cluster)
    found = _inspect_network(network)
    if found is not None and _network_label(found, LABEL_DATA_NETWORK_OF) != cluster:
        raise TestbedError(
            f"network {network} exists but is not the data network of cluster {cluster} "
            f"(the management network of cluster {cluster}-data?): pick another cluster name"
        )
    label = f"{LABEL_DATA_NETWORK_OF}={cluster}"
    _ensure_network(network, subnet, options=["--internal", "--disable-dns", "--label", label])


def _remove_data_network(cluster: str) -> None:
    """Remove the cluster's data network, if it has one; its containers must be gone."""
    found = _inspect_network(data_network_name(cluster))
    if found is not None and _network_label(found, LABEL_DATA_NETWORK_OF) == cluster:
        podman("network", "rm", data_network_name(cluster))


def _ensure_network(network: str, subnet: str, *, options: Sequence[str] = ()) -> None:
    """Create the network with more `podman network create` options unless it exists with
    this subnet and the same internal flag (--internal in options or not)."""
    found = _inspect_network(network)
    if found is not None:
        subnets = [s.get("subnet") for s in found.get("subnets") or []]
        if subnets == [subnet] and bool(found.get("internal")) == ("--internal" in options):
            return
        podman("network", "rm", network)
    created = podman("network", "create", *options, "--subnet", subnet, network, check=False)
    if created.returncode != 0:
        hint = ""
        if "already" in created.stderr:
            hint = (
                f"\nanother network uses {subnet}: pick another subnet_index, or remove a stale "
                "cluster with `python -m tests.cluster.testbed down NAME` (see `status`)"
            )
        raise TestbedError(f"{CommandError(created.args, created)}{hint}")


def host_key(cluster_dir: Path, node: Node) -> Path:
    """The node's own SSH host key (ed25519), made once and kept: a recreated node keeps its
    identity, and no two nodes share a key (the image's own keys are the same everywhere)."""
    path = cluster_dir / f"{node.name}.ssh_host_ed25519_key"
    if not path.exists() or not path.with_name(path.name + ".pub").exists():
        path.unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(path)])
    return path


def host_key_volumes(node: Node, cluster_dir: Path) -> list[str]:
    """podman run arguments that give the node its own host key."""
    key = host_key(cluster_dir, node)
    return ["--volume", f"{key}:/etc/ssh/ssh_host_ed25519_key:ro",
            "--volume", f"{key}.pub:/etc/ssh/ssh_host_ed25519_key.pub:ro"]


def write_known_hosts(cluster_dir: Path, members: Sequence[Node]) -> Path:
    """known_hosts for the cluster's containers, by name and address (as the inventory and the
    nodes themselves reach them): launches under test check host keys, as on a real cluster."""
    lines = []
    for node in members:
        kind, blob = Path(f"{host_key(cluster_dir, node)}.pub").read_text().split()[:2]
        names = ",".join([node.name, node.ip, *([node.data_ip] if node.data_ip else [])])
        lines.append(f"{names} {kind} {blob}\n")
    path = cluster_dir / "known_hosts"
    path.write_text("".join(lines))
    return path


def render_inventory(
    nodes: Sequence[Node],
    extras: Sequence[Node],
    key: Path,
    known_hosts: Path,
    host_vars: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """Ansible INI inventory: nodes in order (order gives node_rank), extras in their own group.
    Host keys are checked against the cluster's known_hosts (Ansible's default).

    A node with a data address gets torchherd_address=<it>, the address the other nodes reach
    it at; ansible_host stays the management address (SSH). host_vars, by container name, adds
    or overrides variables of single hosts."""
    host_vars = host_vars or {}
    unknown = set(host_vars) - {member.name for member in (*nodes, *extras)}
    if unknown:
        raise ValueError(f"host_vars for hosts not in the inventory: {sorted(unknown)}")
    variables = [
        "ansible_user=root",
        f"ansible_ssh_private_key_file={key}",
        "ansible_python_interpreter=/usr/bin/python3",
        f"ansible_ssh_common_args='-o UserKnownHostsFile={known_hosts}'",
    ]
    lines: list[str] = []
    for group, members in ((NODES_GROUP, nodes), (EXTRAS_GROUP, extras)):
        if not members:
            continue
        lines += [f"[{group}]", *(_host_line(m, host_vars.get(m.name, {})) for m in members), ""]
        lines += [f"[{group}:vars]", *variables, ""]
    return "\n".join(lines)


def _host_line(member: Node, host_vars: Mapping[str, str]) -> str:
    variables = {"ansible_host": member.ip}
    if member.data_ip is not None:
        variables["torchherd_address"] = member.data_ip
    variables.update(host_vars)
    bad = [name for name in variables if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
    if bad:
        raise ValueError(f"bad variable names for {member.name}: {bad}")
    # Quoted as Ansible's INI parser splits a host line (shlex): a value may hold spaces.
    pairs = [f"{name}={shlex.quote(str(value))}" for name, value in variables.items()]
    return " ".join([member.name, *pairs])


def status(cluster: str | None = None) -> list[dict[str, str]]:
    """Testbed containers (of one cluster, or all): cluster, role, index, name, ip, state, and
    data_ip, mgmt_if, data_if (data_ip and data_if empty without a data network)."""
    label = f"label={LABEL_CLUSTER}" + (f"={cluster}" if cluster else "")
    listed = podman("ps", "--all", "--filter", label, "--format", "json").stdout
    rows = []
    for container in json.loads(listed or "[]"):
        labels = container.get("Labels") or {}
        rows.append(
            {
                "cluster": labels.get(LABEL_CLUSTER, ""),
                "role": labels.get(LABEL_ROLE, ""),
                "index": labels.get(LABEL_INDEX, "0"),
                "name": container["Names"][0],
                # From the label: a stopped or killed container has no address in inspect.
                "ip": labels.get(LABEL_IP, ""),
                "data_ip": labels.get(LABEL_DATA_IP, ""),
                "mgmt_if": labels.get(LABEL_MGMT_IF, "eth0"),
                "data_if": labels.get(LABEL_DATA_IF, ""),
                "state": container.get("State", ""),
            }
        )
    return sorted(rows, key=lambda r: (r["cluster"], r["role"] != "node", int(r["index"])))


def attach(name: str) -> Cluster:
    """The Cluster object of a cluster started earlier, e.g. by another process."""
    rows = status(name)
    if not rows:
        raise TestbedError(f"no cluster {name!r}: no container labelled {LABEL_CLUSTER}={name}")
    return Cluster(
        name=name,
        nodes=[_node_from_row(r) for r in rows if r["role"] == "node"],
        inventory=state_dir() / name / "inventory.ini",
        key=key_path(),
        extras=[_node_from_row(r) for r in rows if r["role"] == "extra"],
    )


def _node_from_row(row: Mapping[str, str]) -> Node:
    return Node(
        row["name"],
        row["ip"],
        data_ip=row.get("data_ip") or None,
        mgmt_if=row.get("mgmt_if") or "eth0",
        data_if=row.get("data_if") or None,
    )


def down(name: str) -> None:
    """Remove the cluster's containers, networks and state; fine if already gone."""
    _remove_containers(name, [])
    network = network_name(name)
    if podman("network", "exists", network, check=False).returncode == 0:
        podman("network", "rm", "--force", network)
    _remove_data_network(name)
    shutil.rmtree(state_dir() / name, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.testbed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build the node image (no-op when present)")
    build_cmd.add_argument("--force", action="store_true", help="rebuild the node image")
    commands.add_parser("base", help="build only the base image (no-op when present)")
    up_cmd = commands.add_parser("up", help="start or recreate a cluster, wait for SSH")
    up_cmd.add_argument("name")
    up_cmd.add_argument("-n", "--nodes", type=int, default=3)
    up_cmd.add_argument(
        "--subnet-index",
        type=int,
        help=f"0..{MAX_SUBNET_INDEX}; default: the first free one from {AUTO_SUBNET_START}",
    )
    up_cmd.add_argument("--extra", action="append", default=[], help="extra container (repeat)")
    up_cmd.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for SSH")
    up_cmd.add_argument(
        "--data-network",
        action="store_true",
        help="a second network for node-to-node traffic; management carries SSH only",
    )
    up_cmd.add_argument(
        "--no-ipv6", type=int, action="append", default=[], help="node index (repeat)"
    )
    up_cmd.add_argument("--json", action="store_true")
    down_cmd = commands.add_parser("down", help="remove a cluster")
    down_cmd.add_argument("name")
    status_cmd = commands.add_parser("status", help="list testbed containers")
    status_cmd.add_argument("name", nargs="?")
    status_cmd.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    return run_command("testbed", lambda: _run(args))


def _run(args: argparse.Namespace) -> None:
    if args.command == "build":
        print(build(force=args.force, stream=True))
    elif args.command == "base":
        build_base(stream=True)
    elif args.command == "up":
        cluster = up(
            args.name,
            args.nodes,
            args.subnet_index,
            extra=args.extra,
            timeout=args.timeout,
            data_network=args.data_network,
            no_ipv6=args.no_ipv6,
        )
        if args.json:
            print(json.dumps(asdict(cluster), default=str, indent=2))
        else:
            print(cluster.inventory)
    elif args.command == "down":
        down(args.name)
    elif args.command == "status":
        rows = status(args.name)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                print(
                    f"{row['cluster']:<12} {row['role']:<6} {row['name']:<24} "
                    f"{row['ip']:<16} {row['data_ip'] or '-':<16} {row['state']}"
                )


def run_command(prog: str, command: Callable[[], None]) -> int:
    """The exit status of a command line of these tools: 1, its error on stderr, where it
    failed as they can (TestbedError, ValueError); else 0."""
    try:
        command()
    except (TestbedError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
