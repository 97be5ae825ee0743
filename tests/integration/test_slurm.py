"""SLURM: the allocation as the inventory, torchrun as job steps, scancel ends everything.

A real SLURM (slurmctld, munge, slurmd) in podman containers, tests/cluster/slurm.py. As on a
real site, sbatch, salloc and scancel run on the login node (<name>-ctl), a batch script runs
on the first node of its allocation and drives the launch from there over SSH, with torchherd
on shared storage (the checkout, mounted at its own path everywhere).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cluster import slurm as slurm_cluster
from tests.cluster import testbed
from tests.integration.helpers import EXAMPLES, REPO, wait_for

pytestmark = pytest.mark.cluster

NAME = "slurm"
SBATCH = str(EXAMPLES / "torchherd.sbatch")
INVENTORY = str(REPO / "tests" / "cluster" / "slurm" / "torchherd.slurm.yml")
# The image's python3 stands for the project's venv on shared storage (see slurm.py).
TEMPLATE_ENV = {"TORCHHERD_HOME": str(REPO), "TORCHHERD_PYTHON": "/usr/bin/python3"}
ANSIBLE_ENV = ["env", f"ANSIBLE_CONFIG={REPO / 'ansible.cfg'}",
               "ANSIBLE_INVENTORY_UNPARSED_FAILED=1"]
OK_LINE = re.compile(r"torchherd-allreduce ok host=(\S+) node_rank=(\d+) local_rank=0 rank=(\d+)")
# Anything of a torchherd launch on a node: torchrun and workers, the supervisor and modules
# (a bare interpreter: pipelined Ansible), srun, the driver and ansible-playbook (the
# driver's: python -c "# torchherd: ansible-playbook as the driver runs it ..."), SSH masters.
JOB_PROCS = re.compile(
    r"torch\.distributed\.run|allreduce\.py|^srun |driver launch|ansible-playbook"
    r"|-m ansible playbook|torchherd launch"
    r"|^/usr/bin/python3(\.11)?$|^ssh: |slurmstepd: \[\d+\.\d+\]"
)


@pytest.fixture(scope="module")
def slurm(node_image: str):
    """Controller + 4 slurmd nodes, shared by this module; jobs here leave them idle."""
    with testbed.reserve(NAME):
        cluster = slurm_cluster.up(NAME, 4)
        yield cluster
        slurm_cluster.down(NAME)


def names(cluster, *indexes: int) -> list[str]:
    return [cluster.nodes[i].name for i in indexes]


def unwrap(value):
    """ansible-inventory marks plugin strings as {"__ansible_unsafe": value}."""
    return value.get("__ansible_unsafe") if isinstance(value, dict) else value


def leftovers(cluster, node) -> list[str]:
    """Processes of a torchherd launch on the node, and any carrying a run's marker."""
    listed = cluster.exec(node, ["ps", "-eo", "pid=,args="]).stdout.splitlines()
    found = [line.strip() for line in listed
             if JOB_PROCS.search(line.strip().split(None, 1)[-1])]
    marked = cluster.exec(node, ["sh", "-c", "grep -l -a TORCHHERD_RUN= /proc/[0-9]*/environ"],
                          check=False).stdout.split()
    return found + [f"marker: {path}" for path in marked]


def running_job(cluster, job_id: str) -> tuple[list[str], str]:
    """Submit-side wait for a job to run: its nodes and its run directory on the nodes."""
    cluster.wait_job(job_id, ["RUNNING"], timeout=60)
    return cluster.job_nodes(job_id), f"/root/.torchherd/runs/slurm-{job_id}"


def still_running(cluster, job_id: str, host: str, before: str) -> None:
    """Fails, with the job's output, where the job ended before `before`."""
    if cluster.job_state(job_id) != "RUNNING":
        output = cluster.exec(host, ["cat", f"/root/torchherd-{job_id}.out"])
        raise AssertionError(f"job {job_id} ended before {before}:\n{output.stdout}")


def node_logs(cluster, job_id, hosts, lines: int = 40) -> str:
    """The end of each node's log of the job's run: with the job's output, what a failed job's
    assertion shows (a rank that crashed, e.g. SIGABRT at exit, leaves its last words there)."""
    run_dir = f"/root/.torchherd/runs/slurm-{job_id}"
    return "".join(
        f"\n--- {host}: {run_dir}/node.log (last {lines} lines)\n"
        + cluster.exec(host, ["tail", "-n", str(lines), f"{run_dir}/node.log"], check=False).stdout
        for host in hosts)


def test_the_template_from_a_pip_install_runs_with_the_installed_torchherd(slurm, wheel):
    """A user with torchherd from the wheel: a venv on every node (shared storage on a real
    site), `torchherd init` of a project, the venv activated before sbatch: the template finds
    the installed torchherd, with no checkout anywhere in its environment."""
    venv, project = "/root/th-venv", "/root/th-project"

    def install(node) -> None:
        testbed.podman("cp", str(wheel), f"{node.name}:/root/{wheel.name}")
        # The image's python3 has the driver's dependencies (no index in the cluster); its pip
        # installs into the venv it runs in.
        slurm.exec(node, ["python3", "-m", "venv", "--without-pip", "--system-site-packages",
                          venv])
        slurm.exec(node, [f"{venv}/bin/python", "-m", "pip", "install", "-q", "--no-deps",
                          "--no-index", f"/root/{wheel.name}"])
        slurm.exec(node, [f"{venv}/bin/torchherd", "init", project])

    with ThreadPoolExecutor() as pool:  # every node's own install, all at once
        list(pool.map(install, (slurm.ctl, *slurm.nodes)))
    job_id = None
    try:
        submitted = slurm.slurm([
            "env", f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin", "sbatch", "--parsable",
            "--wait", "--nodes=2", f"--chdir={project}", f"--output={project}/torchherd-%j.out",
            "examples/torchherd.sbatch", "--code-src", "examples", "--nproc-per-node", "1", "--",
            "allreduce.py",
        ], check=False, timeout=300)  # fmt: skip
        job_id = submitted.stdout.strip().split(";")[0]
        allocated = slurm.job_nodes(job_id)
        output = slurm.exec(allocated[0], ["cat", f"{project}/torchherd-{job_id}.out"]).stdout
        assert submitted.returncode == 0, output + node_logs(slurm, job_id, allocated)
        assert "succeeded: every node exited 0" in output
        summary = json.loads(slurm.exec(allocated[0], [
            "cat", f"{project}/runs/slurm-{job_id}/summary.json"]).stdout)
        assert summary["state"] == "succeeded" and summary["world_size"] == 2
        # It was the installed torchherd that ran: its collection, not the checkout's.
        assert str(REPO) not in output
    finally:
        def clean(node) -> None:  # the next tests find the nodes as they were
            slurm.exec(node, ["rm", "-rf", venv, project, f"/root/{wheel.name}",
                              f"/root/.torchherd/runs/slurm-{job_id}"], check=False)
            slurm.exec(node, ["find", "/root/.torchherd", "-maxdepth", "1", "-name", "runs",
                              "-empty", "-delete"], check=False)

        with ThreadPoolExecutor() as pool:
            list(pool.map(clean, (slurm.ctl, *slurm.nodes)))


def test_inventory_lists_exactly_the_allocated_nodes(slurm):
    skipped = slurm.nodes[1].name
    script = f'echo "job=$SLURM_JOB_ID"; ansible-inventory -i {INVENTORY} --list'
    out = slurm.slurm(["salloc", "--nodes=3", f"--exclude={skipped}", "--gres=gpu:1",
                       *ANSIBLE_ENV, "sh", "-c", script]).stdout
    first, _sep, listed = out.partition("\n")
    job_id = first.removeprefix("job=")
    inventory = json.loads(listed)

    allocated = slurm.job_nodes(job_id)
    assert allocated == names(slurm, 0, 2, 3)
    # Exactly the allocation, in SLURM's order (the order of SLURM_NODEID): node_rank order.
    assert inventory["torchherd_nodes"]["hosts"] == allocated
    hostvars = inventory["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(allocated)
    by_name = {node.name: node for node in slurm.nodes}
    for host in allocated:
        variables = {key: unwrap(value) for key, value in hostvars[host].items()}
        assert variables == {
            "ansible_host": by_name[host].ip,  # SLURM's NodeAddr
            "torchherd_slurm_job_id": job_id,
            "torchherd_slurm_node": host,
            "torchherd_slurm_gpus": 1,
        }


def test_inventory_outside_a_running_job_fails_clearly(slurm):
    listing = [*ANSIBLE_ENV, "ansible-inventory", "-i", INVENTORY, "--list"]
    outside = slurm.slurm(listing, check=False)
    assert outside.returncode != 0
    assert "no SLURM job: expected to run inside an allocation" in outside.stderr

    held = slurm.sbatch(["--hold", "--wrap", "true"])
    try:
        pending = slurm.slurm(["env", f"SLURM_JOB_ID={held}", *listing], check=False)
    finally:
        slurm.slurm(["scancel", held])
    assert pending.returncode != 0
    assert f"SLURM job {held}: expected a RUNNING job, found it PENDING" in pending.stderr

    unknown = slurm.slurm(["env", "SLURM_JOB_ID=999999", *listing], check=False)
    assert unknown.returncode != 0
    assert "Invalid job id" in unknown.stderr


def test_sbatch_launches_on_exactly_the_allocated_nodes(slurm):
    """sbatch -N 3 of the template: the verified launch on the 3 nodes SLURM chose, ranks in
    allocation order, torchrun as a step of the job; the job's output holds the summary."""
    skipped = slurm.nodes[1]
    submitted = slurm.slurm([
        "env", *(f"{k}={v}" for k, v in TEMPLATE_ENV.items()),
        "sbatch", "--parsable", "--wait", "--nodes=3", f"--exclude={skipped.name}",
        "--chdir=/root", "--output=/root/torchherd-%j.out", SBATCH,
        "--code-src", str(EXAMPLES), "--nproc-per-node", "1", "--", "allreduce.py",
    ], check=False, timeout=300)  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    allocated = slurm.job_nodes(job_id)
    batch_host = allocated[0]
    output = slurm.exec(batch_host, ["cat", f"/root/torchherd-{job_id}.out"]).stdout
    assert submitted.returncode == 0, output + node_logs(slurm, job_id, allocated)
    assert slurm.job_state(job_id) == "COMPLETED"
    assert allocated == names(slurm, 0, 2, 3)

    # The per-node summary, in the job's output: every allocated node, its rank, succeeded.
    rows = re.findall(rf"^\W*({NAME}-node\d+)\W+(\d+)\W+succeeded\W+0\W", output, re.MULTILINE)
    assert rows == [(host, str(rank)) for rank, host in enumerate(allocated)], output
    assert "succeeded: every node exited 0" in output
    run_id = f"slurm-{job_id}"  # the template names the run after the job
    summary = slurm.exec(batch_host, ["cat", f"/root/runs/{run_id}/summary.json"]).stdout
    summary = json.loads(summary)
    assert summary["state"] == "succeeded"
    assert summary["world_size"] == 3

    seen = {}
    for rank, host in enumerate(allocated):
        run_dir = f"/root/.torchherd/runs/{run_id}"
        cmd = json.loads(slurm.exec(host, ["cat", f"{run_dir}/cmd.json"]).stdout)
        # torchrun ran as a step of this job, on this node.
        assert cmd[:3] == ["srun", f"--jobid={job_id}", f"--nodelist={host}"]
        assert cmd[cmd.index("--node-rank") + 1] == str(rank)
        for hostname, node_rank, global_rank in OK_LINE.findall(
                slurm.exec(host, ["cat", f"{run_dir}/node.log"]).stdout):
            assert (hostname, int(node_rank)) == (host, rank)
            seen[int(global_rank)] = host
    assert seen == dict(enumerate(allocated))
    # Nothing ran on the node outside the allocation.
    assert slurm.exec(skipped, ["test", "-e", "/root/.torchherd/runs"], check=False).returncode
    for node in slurm.nodes:
        assert leftovers(slurm, node) == [], node.name


def test_scancel_leaves_no_process_on_any_node(slurm):
    job_id = slurm.sbatch([
        "--nodes=3", "--chdir=/root", "--output=/root/torchherd-%j.out", SBATCH,
        "--code-src", str(EXAMPLES), "--nproc-per-node", "1",
        "--", "allreduce.py", "--sleep", "600",
    ], env=TEMPLATE_ENV)  # fmt: skip
    allocated, run_dir = running_job(slurm, job_id)

    def all_reduced():
        still_running(slurm, job_id, allocated[0], "scancel")
        logs = [slurm.exec(host, ["cat", f"{run_dir}/node.log"], check=False).stdout
                for host in allocated]
        return all("torchherd-allreduce ok" in log for log in logs)

    wait_for(all_reduced, 150, "all-reduce on every node")
    for host in allocated:
        # SLURM runs torchrun: its parent is the step's slurmstepd.
        pid = slurm.pids(host, r"torch\.distributed\.run")[-1]
        parent = slurm.exec(host, ["ps", "-o", "ppid=", "-p", str(pid)]).stdout.strip()
        comm = slurm.exec(host, ["ps", "-o", "args=", "-p", parent]).stdout
        assert comm.startswith(f"slurmstepd: [{job_id}."), comm

    slurm.slurm(["scancel", job_id])
    slurm.wait_job(job_id, ["CANCELLED"], timeout=30)
    left = {}

    def nothing_left():
        left.clear()
        left.update({n.name: found for n in slurm.nodes if (found := leftovers(slurm, n))})
        return not left

    try:
        wait_for(nothing_left, 30, "clean nodes after scancel")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; left: {left}") from None
    # The supervisor saw torchrun end on every node and recorded it.
    for host in allocated:
        assert slurm.exec(host, ["cat", f"{run_dir}/exit_code"]).stdout.strip()


@pytest.mark.parametrize("launcher,script,line", [
    ("accelerate", "accelerate_gather.py", r"torchherd-accelerate ok host=(\S+) "
                                           r"process_index=(\d+) .*num_processes=2 "),
    ("deepspeed", "deepspeed_step.py", r"torchherd-deepspeed ok host=(\S+) node_rank=\S+ "
                                       r"local_rank=0 rank=(\d+) world_size=2 "),
])
def test_other_launchers_run_as_steps_of_the_job(slurm, launcher, script, line):
    """launcher accelerate or deepspeed under sbatch: each node's launcher is a step of the
    job (srun), with the node's rank of the allocation."""
    submitted = slurm.slurm([
        "env", *(f"{k}={v}" for k, v in TEMPLATE_ENV.items()),
        "sbatch", "--parsable", "--wait", "--nodes=2",
        "--chdir=/root", "--output=/root/torchherd-%j.out", SBATCH,
        "--code-src", str(EXAMPLES), "--nproc-per-node", "1",
        "--launcher", launcher, "--", script,
    ], check=False, timeout=300)  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    allocated = slurm.job_nodes(job_id)
    output = slurm.exec(allocated[0], ["cat", f"/root/torchherd-{job_id}.out"]).stdout
    assert submitted.returncode == 0, output + node_logs(slurm, job_id, allocated)
    assert slurm.job_state(job_id) == "COMPLETED"
    seen = {}
    for rank, host in enumerate(allocated):
        run_dir = f"/root/.torchherd/runs/slurm-{job_id}"
        cmd = json.loads(slurm.exec(host, ["cat", f"{run_dir}/cmd.json"]).stdout)
        assert cmd[:3] == ["srun", f"--jobid={job_id}", f"--nodelist={host}"]
        assert launcher in " ".join(cmd)
        # The node's rank of the allocation, in the launcher's own words.
        given = cmd[cmd.index("--machine_rank") + 1] if "--machine_rank" in cmd else next(
            a.split("=", 1)[1] for a in cmd if a.startswith("--node_rank="))
        assert given == str(rank), cmd
        for hostname, global_rank in re.findall(
                line, slurm.exec(host, ["cat", f"{run_dir}/node.log"]).stdout):
            seen[int(global_rank)] = hostname
    assert seen == dict(enumerate(allocated)), output
    for node in slurm.nodes:
        assert leftovers(slurm, node) == [], node.name


def test_a_node_lost_in_the_allocation_is_left_out_and_the_job_resumes_on_its_spare(slurm):
    """sbatch -N 4 of a 3-node job with a restart: the fourth node of the allocation is the
    spare. A node killed mid-run (its container, as a machine losing power) is left out of the
    relaunch, the spare takes its rank, the job resumes from its checkpoint, and the allocation
    lives on (the template's --no-kill). Last in this module: it leaves a node dead."""
    job_id = slurm.sbatch([
        "--nodes=4", "--chdir=/root", "--output=/root/torchherd-%j.out", SBATCH,
        "--code-src", str(EXAMPLES), "--nproc-per-node", "1", "--node-count", "3",
        "--restarts", "1", "--", "train_ddp.py", "--epochs", "8", "--epoch-seconds", "1",
        "--ckpt-dir", "/root/ck-slurm",
    ], env=TEMPLATE_ENV)  # fmt: skip
    allocated, run_dir = running_job(slurm, job_id)

    def three_epochs():
        still_running(slurm, job_id, allocated[0], "the kill")
        log = slurm.exec(allocated[0], ["cat", f"{run_dir}/node.log"], check=False).stdout
        return len(re.findall(r"torchherd-train epoch=\d+", log)) >= 3

    wait_for(three_epochs, 180, "three epochs")
    lost = next(node for node in slurm.nodes if node.name == allocated[1])
    slurm.kill(lost)
    # The batch script's end: SLURM keeps the job COMPLETING until it hears from the dead
    # node or marks it DOWN (SlurmdTimeout, 300 s by default), COMPLETED after.
    state = slurm.wait_job(job_id, ["COMPLETING", "COMPLETED", "FAILED", "NODE_FAIL",
                                    "CANCELLED"], timeout=300)
    output = slurm.exec(allocated[0], ["cat", f"/root/torchherd-{job_id}.out"]).stdout
    alive = [allocated[0], *allocated[2:]]
    exit_code = re.search(r"ExitCode=(\d+:\d+)", slurm.job_line(job_id)).group(1)
    assert (state, exit_code) in (("COMPLETING", "0:0"), ("COMPLETED", "0:0")), (
        f"{state} {exit_code}\n" + output + node_logs(slurm, job_id, alive))
    summary = json.loads(slurm.exec(
        allocated[0], ["cat", f"/root/runs/slurm-{job_id}/summary.json"]).stdout)
    [incident] = summary["incidents"]
    assert (incident["kind"], incident["node"], incident["replaced_by"]) == (
        "node_lost", allocated[1], allocated[3]), incident
    assert summary["state"] == "succeeded" and summary["hosts"][allocated[3]]["node_rank"] == 1
    log = slurm.exec(allocated[0], ["cat", f"{run_dir}/node.log"]).stdout
    assert int(re.search(r"start_epoch=(\d+) world_size=3 restart=1", log).group(1)) >= 2, log
    assert re.search(r"torchherd-train done epochs=8", log), log
    for host in alive:
        node = next(n for n in slurm.nodes if n.name == host)
        assert leftovers(slurm, node) == [], host
