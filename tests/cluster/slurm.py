"""A real SLURM cluster on one machine: slurmctld, munge and slurmd in podman containers.

Built on tests/cluster/testbed.py: the node image (plus slurm-wlm, munge and the controller-side
Python packages: tests/cluster/slurm/Containerfile), the network, fixed IPs and MACs, the SSH
key and the labels are testbed's, so `python -m tests.cluster.testbed status|down NAME` see
these clusters too. The layout is a real site's, shrunk:

    <name>-ctl       login and controller node: slurmctld; sbatch, salloc, scancel run here
    <name>-node<i>   compute nodes: slurmd and sshd; a batch script runs on the first node
                     of its allocation, which reaches the others over SSH with the user's key
    shared storage   the checkout, mounted read-only at its own path in every container, like
                     a project directory on NFS; the image's python3 stands for the project's
                     venv there (the driver's dependencies from pyproject.toml, and torch)

slurm.conf: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, SlurmUser=root (nothing
else works in an unprivileged container), and NODE_GPUS count-only GPUs per node, so that SLURM
really allocates and reports GPUs although there are no devices (empty files stand in for them).

    python -m tests.cluster.slurm build
    python -m tests.cluster.slurm up NAME [-n 4] [--subnet-index 7]
    python -m tests.cluster.slurm down NAME
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from tests.cluster import testbed
from tests.cluster.testbed import Cluster, Node, TestbedError, podman, run_command, state_dir

HERE = Path(__file__).resolve().parent / "slurm"
REPO = Path(__file__).resolve().parents[2]
IMAGE_REPO = "localhost/torchherd-slurm-node"
# What the image is built from (the tag hashes these): the rest of HERE is the tests' own.
BUILD_FILES = ("Containerfile", "munge.conf")
CONTROLLER = "ctl"
NODE_CPUS = 2
NODE_GPUS = 2
# Seconds between SIGTERM and SIGKILL when SLURM ends a job (scancel, time limit).
KILL_WAIT = 3
_STATE = re.compile(r"(?:^|\s)JobState=(\S+)")
_NODELIST = re.compile(r"(?:^|\s)NodeList=(\S+)")


def _log(message: str) -> None:
    print(f"[slurm] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Image


def wheel_packages() -> list[str]:
    """What the batch host needs to drive a launch: the driver's own runtime dependencies, as
    its installed distribution lists them (pyproject.toml), so that a new one is never missed."""
    try:
        listed = requires("torchherd") or []
    except PackageNotFoundError as exc:
        raise TestbedError("torchherd is not installed here: run scripts/setup.sh") from exc
    return [re.split(r"[\s;<>=!~\[]", req, maxsplit=1)[0]
            for req in listed if "extra ==" not in req]


def requirements() -> str:
    """Pins of the controller-side packages, taken from the interpreter running this."""
    try:
        return "".join(f"{name}=={version(name)}\n" for name in wheel_packages())
    except PackageNotFoundError as exc:
        raise TestbedError(f"{exc.name} is not installed here: run scripts/setup.sh") from exc


def image_tag(base: str) -> str:
    """The SLURM image tag for this directory, the node image `base` and the wheel pins."""
    digest = hashlib.sha256(f"{base}\n{requirements()}".encode())
    for name in BUILD_FILES:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return f"{IMAGE_REPO}:{digest.hexdigest()[:12]}"


def build(*, stream: bool = False) -> str:
    """Build the SLURM node image on top of testbed's node image unless present; its tag."""
    base = testbed.build(stream=stream)
    tag = image_tag(base)
    with testbed._locked("slurm-build"):
        if testbed.image_exists(tag):
            return tag
        start = time.monotonic()
        wheelhouse = ensure_wheelhouse()
        # --no-cache: the layer cache keys a RUN on its text, not on the mounted wheelhouse,
        # and would keep the packages of an older build (the tag says that they changed).
        podman(
            "build", "--no-cache",
            "--network", "host",  # as the node image's build (testbed._build_node_image)
            "--file", str(HERE / "Containerfile"),
            "--build-arg", f"BASE_IMAGE={base}",
            "--volume", f"{wheelhouse}:/wheelhouse:ro",
            "--tag", tag,
            str(HERE),
            stream=stream,
        )  # fmt: skip
        listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO).stdout
        for old in listed.split():
            if old != tag:
                podman("rmi", old, check=False)  # fails, harmlessly, while a cluster uses it
        _log(f"image {tag} built in {time.monotonic() - start:.1f} s")
    return tag


def ensure_wheelhouse() -> Path:
    """Wheels of the controller-side packages for the nodes' python, downloaded once."""
    wheelhouse = state_dir() / "slurm-wheelhouse"
    wanted = requirements()
    marker = wheelhouse / "requirements.txt"
    if marker.is_file() and marker.read_text() == wanted:
        return wheelhouse
    partial = state_dir() / "slurm-wheelhouse.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    minors = range(17, testbed.NODE_GLIBC_MINOR + 1)
    testbed.run([
        sys.executable, "-m", "pip", "download", "--dest", str(partial),
        "--only-binary=:all:", "--implementation", "cp",
        "--python-version", testbed.NODE_PYTHON_VERSION,
        *(f"--platform=manylinux_2_{minor}_x86_64" for minor in minors),
        *wanted.split(),
    ])  # fmt: skip
    (partial / "requirements.txt").write_text(wanted)
    shutil.rmtree(wheelhouse, ignore_errors=True)
    partial.rename(wheelhouse)
    return wheelhouse


# ---------------------------------------------------------------------------------------------
# Cluster


@dataclass
class SlurmCluster(Cluster):
    """A testbed Cluster whose only extra is the controller, with SLURM's commands."""

    @property
    def ctl(self) -> Node:
        return self.extras[0]

    def slurm(self, argv: Sequence[str], check: bool = True, timeout: float | None = 60):
        """Run a SLURM client command (with its environment, as `env K=V cmd`) on the
        controller, the cluster's login node."""
        return self.exec(self.ctl, argv, check=check, timeout=timeout)

    def sbatch(self, argv: Sequence[str], env: dict[str, str] | None = None) -> str:
        """Submit a batch job from the login node; its job id."""
        pairs = [f"{k}={v}" for k, v in (env or {}).items()]
        out = self.slurm(["env", *pairs, "sbatch", "--parsable", *argv]).stdout
        return out.strip().split(";")[0]

    def job_line(self, job_id: str) -> str:
        return self.slurm(["scontrol", "show", "job", "-o", job_id]).stdout

    def job_state(self, job_id: str) -> str:
        match = _STATE.search(self.job_line(job_id))
        return match.group(1) if match else ""

    def job_nodes(self, job_id: str) -> list[str]:
        """The job's nodes in SLURM's order (the order of SLURM_NODEID)."""
        match = _NODELIST.search(self.job_line(job_id))
        if not match or match.group(1) == "(null)":
            return []
        return self.slurm(["scontrol", "show", "hostnames", match.group(1)]).stdout.split()

    def wait_job(self, job_id: str, states: Sequence[str], timeout: float = 120) -> str:
        """Poll until the job is in one of `states`; the state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TestbedError(f"job {job_id} still {state} after {timeout:.0f} s, "
                                   f"expected one of {', '.join(states)}")
            time.sleep(0.3)

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until every slurmd has registered and its node is idle."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.slurm(["sinfo", "--noheader", "--Node", "--format", "%N %t"],
                             check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if states and all(states.get(n.name) == "idle" for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise TestbedError(f"SLURM nodes not idle after {timeout:.0f} s: {states or out}")
            time.sleep(0.3)


def render_slurm_conf(ctl: Node, nodes: Sequence[Node]) -> str:
    """slurm.conf of a test cluster: one controller, slurmd on every node at its fixed IP."""
    lines = [
        "# Written by tests/cluster/slurm.py",
        "ClusterName=torchherd",
        f"SlurmctldHost={ctl.name}({ctl.ip})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # No cgroup access in the containers: processes are tracked by parent pid.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ReturnToService=2",
        f"KillWait={KILL_WAIT}",
        "MinJobAge=600",
        "InactiveLimit=0",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        # The containers see the host's CPUs and memory: take the counts below as they are.
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        f"NodeName=DEFAULT CPUs={NODE_CPUS} RealMemory=1000 Gres=gpu:{NODE_GPUS} State=UNKNOWN",
        *(f"NodeName={node.name} NodeAddr={node.ip}" for node in nodes),
        "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def render_gres_conf() -> str:
    # Empty files made by the Containerfile stand in for the devices: SLURM allocates and
    # reports the GPUs (and sets CUDA_VISIBLE_DEVICES in steps), nothing more.
    return f"Name=gpu File=/var/lib/torchherd-gpus/gpu[0-{NODE_GPUS - 1}]\n"


def up(name: str, n: int = 4, subnet_index: int | None = None, *,
       timeout: float = 60.0) -> SlurmCluster:
    """Start (or recreate) SLURM cluster `name`: <name>-ctl at .200 running slurmctld, and n
    nodes <name>-node<i> at .10+i running slurmd; returns once every node is idle."""
    if not 1 <= n <= testbed.FIRST_EXTRA_HOST - testbed.FIRST_NODE_HOST:
        raise ValueError(f"n out of range: {n}")
    image = build()
    key = testbed.ensure_key()
    start = time.monotonic()
    with testbed._locked("networks"):
        testbed._blackhole_testbed_range()
        if subnet_index is None:
            subnet_index = testbed.free_subnet_index(own=name)
        prefix = testbed.subnet_prefix(subnet_index)
        nodes = [Node(f"{name}-node{i}", f"{prefix}.{testbed.FIRST_NODE_HOST + i}")
                 for i in range(n)]
        ctl = Node(f"{name}-{CONTROLLER}", f"{prefix}.{testbed.FIRST_EXTRA_HOST}")
        testbed._remove_containers(name, [node.name for node in (*nodes, ctl)])
        testbed._ensure_network(testbed.network_name(name), f"{prefix}.0/24")

    cluster_dir = state_dir() / name
    cluster_dir.mkdir(parents=True, exist_ok=True)
    (cluster_dir / "slurm.conf").write_text(render_slurm_conf(ctl, nodes))
    (cluster_dir / "gres.conf").write_text(render_gres_conf())
    munge_key = cluster_dir / "munge.key"
    munge_key.write_bytes(os.urandom(1024))
    munge_key.chmod(0o600)
    members = [("extra", 0, ctl), *(("node", i, node) for i, node in enumerate(nodes))]
    known_hosts = testbed.write_known_hosts(cluster_dir, [ctl, *nodes])
    for role, index, node in members:
        _start_container(name, node, role, index, image, key, cluster_dir)

    inventory = cluster_dir / "inventory.ini"
    inventory.write_text(testbed.render_inventory(nodes, [ctl], key, known_hosts))
    cluster = SlurmCluster(name=name, nodes=nodes, inventory=inventory, key=key, extras=[ctl])
    cluster.wait_ssh(timeout)  # systemd is up once sshd answers
    daemons = [(ctl, "slurmctld"), *((node, "slurmd") for node in nodes)]
    with ThreadPoolExecutor(len(daemons)) as pool:
        list(pool.map(lambda d: cluster.exec(d[0], ["systemctl", "start", d[1]]), daemons))
    cluster.wait_idle(timeout)
    _log(f"up {name}: controller + {n} node(s) in {time.monotonic() - start:.1f} s")
    return cluster


def _start_container(cluster: str, node: Node, role: str, index: int, image: str, key: Path,
                     cluster_dir: Path) -> None:
    machine_id = testbed.write_machine_id(cluster_dir, node.name)
    podman(
        "run", "--detach",
        "--name", node.name,
        "--hostname", node.name,
        "--network", testbed.network_name(cluster),
        "--ip", node.ip,
        "--mac-address", testbed.mac_for(node.ip),
        "--cap-add", "NET_ADMIN,NET_RAW",  # as testbed's nodes: the firewall phase needs it
        "--systemd", "always",
        "--volume", f"{machine_id}:/etc/machine-id:ro",
        "--volume", f"{key.with_suffix('.pub')}:/etc/ssh/torchherd_authorized_keys:ro",
        # The user's key, as on a shared home: the batch host logs into the other nodes.
        "--volume", f"{key}:/root/.ssh/id_ed25519:ro",
        *testbed.host_key_volumes(node, cluster_dir),
        # The site's known hosts, as HPC sites keep them: the batch host's launch checks keys.
        "--volume", f"{cluster_dir / 'known_hosts'}:/etc/ssh/ssh_known_hosts:ro",
        "--volume", f"{cluster_dir / 'munge.key'}:/etc/torchherd/munge.key:ro",
        "--volume", f"{cluster_dir / 'slurm.conf'}:/etc/slurm/slurm.conf:ro",
        "--volume", f"{cluster_dir / 'gres.conf'}:/etc/slurm/gres.conf:ro",
        "--volume", f"{REPO}:{REPO}:ro",
        "--label", f"{testbed.LABEL_CLUSTER}={cluster}",
        "--label", f"{testbed.LABEL_ROLE}={role}",
        "--label", f"{testbed.LABEL_INDEX}={index}",
        "--label", f"{testbed.LABEL_IP}={node.ip}",
        image,
        "/lib/systemd/systemd",
    )  # fmt: skip


def attach(name: str) -> SlurmCluster:
    """The SlurmCluster of a cluster started earlier, e.g. by `python -m tests.cluster.slurm up`."""
    found = testbed.attach(name)
    return SlurmCluster(name=found.name, nodes=found.nodes, inventory=found.inventory,
                        key=found.key, extras=found.extras)


def down(name: str) -> None:
    testbed.down(name)


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build the SLURM node image (no-op when present)")
    up_cmd = commands.add_parser("up", help="start or recreate a SLURM cluster")
    up_cmd.add_argument("name")
    up_cmd.add_argument("-n", "--nodes", type=int, default=4)
    up_cmd.add_argument("--subnet-index", type=int)
    down_cmd = commands.add_parser("down", help="remove a cluster")
    down_cmd.add_argument("name")
    args = parser.parse_args(argv)
    return run_command("slurm", lambda: _run(args))


def _run(args: argparse.Namespace) -> None:
    if args.command == "build":
        print(build(stream=True))
    elif args.command == "up":
        cluster = up(args.name, args.nodes, args.subnet_index)
        print(f"sbatch etc.: podman exec -it {cluster.ctl.name} bash")
    else:
        down(args.name)


if __name__ == "__main__":
    sys.exit(main())
