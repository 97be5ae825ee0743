"""The SLURM inventory's reading of scontrol's output (recorded from SLURM 22.05 and 23.11)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.torchherd.cluster.plugins.inventory.slurm import (
    SlurmError,
    allocation,
    detail_groups,
    gpus_in_gres,
    gpus_in_tres,
    gpus_per_node,
    job_fields,
    node_addresses,
    parse_record,
)

COLLECTIONS = Path(__file__).resolve().parents[4] / "collection"
# scontrol --details --oneliner show job 1 (22.05.8), for sbatch -N 3 -x n1 --gres=gpu:2.
JOB_2205 = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 "
    "RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-21T11:24:40 "
    "Partition=batch AllocNode:Sid=ctl:81 ReqNodeList=(null) ExcNodeList=n1 "
    "NodeList=n[0,2-3] BatchHost=n0 NumNodes=3 NumCPUs=3 NumTasks=3 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=3,node=3,billing=3 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* JOB_GRES=gpu:6   Nodes=n[0,2-3] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/ "
    "StdErr=//slurm-1.out StdIn=/dev/null StdOut=//slurm-1.out Power= TresPerNode=gres:gpu:2 "
)
# 23.11 style, --gpus=6 spread 4 + 2 over two nodes, typed GPUs.
JOB_2311 = (
    "JobId=77 JobName=train JobState=RUNNING Reason=None NodeList=gpu[07-08] BatchHost=gpu07 "
    "NumNodes=2 TRES=cpu=16,mem=64G,node=2,billing=16,gres/gpu=6,gres/gpu:a100=6 "
    "JOB_GRES=gpu:a100:6 Nodes=gpu07 CPU_IDs=0-7 Mem=32768 GRES=gpu:a100:4(IDX:0-3) "
    "Nodes=gpu08 CPU_IDs=0-7 Mem=32768 GRES=gpu:a100:2(IDX:1,3) MinCPUsNode=1 "
    "Command=/home/u/run.sh --lr=3e-4 TresPerJob=gres/gpu:6"
)
NODES = (
    "NodeName=n0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 Gres=gpu:2 NodeAddr=10.66.122.10 "
    "NodeHostName=n0 Version=22.05.8 OS=Linux 6.18 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000\n"
    "NodeName=n2 Arch=x86_64 Gres=gpu:2 NodeAddr=10.66.122.12 NodeHostName=n2\n"
    "NodeName=n3 Arch=x86_64 Gres=gpu:2 NodeAddr=n3-ib NodeHostName=n3\n"
)


def test_records_split_into_ordered_pairs():
    pairs = parse_record(JOB_2205)
    fields = job_fields(pairs)
    assert fields["JobState"] == "RUNNING"
    assert fields["NodeList"] == "n[0,2-3]"
    assert fields["TRES"] == "cpu=3,node=3,billing=3"
    assert fields["ReqB:S:C:T"] == "0:0:*:*"
    assert fields["Power"] == ""
    # A value with spaces and a `--key=value` in it stays one value.
    assert job_fields(parse_record(JOB_2311))["Command"] == "/home/u/run.sh --lr=3e-4"


def test_detail_groups_carry_each_node_groups_gres():
    assert detail_groups(parse_record(JOB_2205)) == [("n[0,2-3]", "gpu:2(IDX:0-1)")]
    assert detail_groups(parse_record(JOB_2311)) == [
        ("gpu07", "gpu:a100:4(IDX:0-3)"), ("gpu08", "gpu:a100:2(IDX:1,3)")]


@pytest.mark.parametrize("text, gpus", [
    ("gpu:2(IDX:0-1)", 2),
    ("gpu:a100:4(IDX:0-3)", 4),
    ("gpu(CNT:3)", 3),
    ("gpu(IDX:0,2-3)", 3),
    ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:1)", 2),
    ("gpu:2(IDX:0,1),nic:1(IDX:0)", 2),
    ("gres:gpu:2", 2),
    ("gres/gpu:8", 8),
    ("gres/gpu:h100:8", 8),
    ("gres/gpu=4", 4),
    ("gres/nic:1", 0),
    ("(null)", 0),
    ("", 0),
    (None, 0),
])
def test_gpus_in_gres(text, gpus):
    assert gpus_in_gres(text) == gpus


def test_gpus_in_tres_takes_the_untyped_count():
    assert gpus_in_tres("cpu=16,node=2,gres/gpu=6,gres/gpu:a100=6") == 6
    assert gpus_in_tres("cpu=3,node=3,billing=3") == 0


def expand(expression):
    return {"n[0,2-3]": ["n0", "n2", "n3"], "gpu07": ["gpu07"], "gpu08": ["gpu08"]}[expression]


def test_gpus_per_node_prefers_the_per_node_detail():
    pairs = parse_record(JOB_2311)
    got = gpus_per_node(job_fields(pairs), detail_groups(pairs), ["gpu07", "gpu08"], expand)
    assert got == {"gpu07": 4, "gpu08": 2}


def test_gpus_per_node_falls_back_to_per_node_then_even_total_then_zero():
    hosts = ["a", "b"]
    assert gpus_per_node({"TresPerNode": "gres/gpu:4"}, [], hosts, expand) == {"a": 4, "b": 4}
    assert gpus_per_node({"JOB_GRES": "gpu:6"}, [], hosts, expand) == {"a": 3, "b": 3}
    assert gpus_per_node({"AllocTRES": "cpu=2,gres/gpu=4"}, [], hosts, expand) == {"a": 2, "b": 2}
    # An uneven total says nothing about one node: 0, not a guess.
    assert gpus_per_node({"TRES": "gres/gpu=3"}, [], hosts, expand) == {"a": 0, "b": 0}
    assert gpus_per_node({"TRES": "cpu=2"}, [("a,b", "(null)")], hosts, expand) == {"a": 0, "b": 0}


def test_node_addresses_are_slurms_node_addr():
    assert node_addresses(NODES) == {"n0": "10.66.122.10", "n2": "10.66.122.12", "n3": "n3-ib"}


class Scontrol:
    """scontrol's answers, by argument list; records the calls."""

    def __init__(self, job=JOB_2205, nodes=NODES, hostnames="n0\nn2\nn3\n"):
        self.answers = {"job": job, "node": nodes, "hostnames": hostnames}
        self.calls = []

    def __call__(self, args):
        self.calls.append(args)
        if args[-2] == "job" and "invalid" in args[-1]:
            raise SlurmError("scontrol show job invalid failed: Invalid job id specified")
        return self.answers[args[-2]]


def test_allocation_lists_the_nodes_in_slurms_order():
    scontrol = Scontrol()
    assert allocation("1", scontrol) == [
        {"name": "n0", "address": "10.66.122.10", "gpus": 2},
        {"name": "n2", "address": "10.66.122.12", "gpus": 2},
        {"name": "n3", "address": "n3-ib", "gpus": 2},
    ]
    assert scontrol.calls[0] == ["--details", "--oneliner", "show", "job", "1"]
    assert ["show", "hostnames", "n[0,2-3]"] in scontrol.calls
    # The detail group's expression is the job's: expanded once.
    assert sum(call[-2] == "hostnames" for call in scontrol.calls) == 1


@pytest.mark.parametrize("job_id, scontrol, message", [
    ("", Scontrol(), "no SLURM job: expected to run inside an allocation"),
    ("1", Scontrol(job=JOB_2205.replace("JobState=RUNNING", "JobState=PENDING")),
     "SLURM job 1: expected a RUNNING job, found it PENDING"),
    ("1", Scontrol(job=JOB_2205.replace("JobState=RUNNING", "JobState=COMPLETED")),
     "found it COMPLETED"),
    ("invalid", Scontrol(), "Invalid job id"),
    ("1", Scontrol(nodes=NODES.splitlines()[0]), "expected scontrol show node to know n2, n3"),
    ("7", Scontrol(job="\n".join(JOB_2205.replace("JobId=1 ", f"JobId={i} ") for i in (8, 9))),
     "expected one job, found 2 records"),
])
def test_allocation_refuses_what_is_not_one_running_job(job_id, scontrol, message):
    with pytest.raises(SlurmError, match=message):
        allocation(job_id, scontrol)


def test_allocation_takes_the_record_of_the_job_asked_for():
    records = "\n".join(JOB_2205.replace("JobId=1 ", f"JobId={i} ") for i in (1, 2))
    assert [n["name"] for n in allocation("1", Scontrol(job=records))] == ["n0", "n2", "n3"]


FAKE_SCONTROL = '''#!{python}
import sys
answers = {answers!r}
args = sys.argv[1:]
if args[-2] == "job" and args[-1] != "1":
    sys.exit("slurm_load_jobs error: Invalid job id specified")
sys.stdout.write(answers[args[-2]])
'''


def test_plugin_through_ansible_inventory(tmp_path):
    """The plugin as Ansible runs it: a job id from the config, compose and keyed groups."""
    scontrol = tmp_path / "scontrol"
    answers = {"job": JOB_2205, "node": NODES, "hostnames": "n0\nn2\nn3\n"}
    scontrol.write_text(FAKE_SCONTROL.format(python=sys.executable, answers=answers))
    scontrol.chmod(0o755)
    config = tmp_path / "job.slurm.yml"
    config.write_text(
        "plugin: torchherd.cluster.slurm\n"
        "job_id: '1'\n"
        f"scontrol: {scontrol}\n"
        "group: train\n"
        "compose:\n  torchherd_address: torchherd_slurm_node ~ '-ib'\n"
        "keyed_groups:\n  - key: torchherd_slurm_gpus | string\n    prefix: gpus\n"
    )
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
           "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1", "ANSIBLE_INVENTORY_ENABLED": "auto"}
    env.pop("SLURM_JOB_ID", None)
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(config), "--list"],
        capture_output=True, text=True, env=env, check=False)
    assert listed.returncode == 0, listed.stderr
    listed = listed.stdout
    inventory = json.loads(listed)
    assert inventory["train"]["hosts"] == ["n0", "n2", "n3"]
    assert inventory["gpus_2"]["hosts"] == ["n0", "n2", "n3"]
    n3 = {k: v.get("__ansible_unsafe", v) if isinstance(v, dict) else v
          for k, v in inventory["_meta"]["hostvars"]["n3"].items()}
    assert n3 == {"ansible_host": "n3-ib", "torchherd_address": "n3-ib",
                  "torchherd_slurm_job_id": "1", "torchherd_slurm_node": "n3",
                  "torchherd_slurm_gpus": 2}

    config.write_text(config.read_text().replace("job_id: '1'", "job_id: '2'"))
    failed = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(config), "--list"],
        capture_output=True, text=True, env=env, check=False)
    assert failed.returncode != 0
    assert "Invalid job id specified" in failed.stderr
