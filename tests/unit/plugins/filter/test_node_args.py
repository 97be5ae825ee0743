"""The arguments of each node's facts call and start (filters facts_args and start_args), from
real plans and schedules: every key an option of its module, and each rule of the task files
they replaced written out the plain way."""

from __future__ import annotations

import ast
import inspect

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.facts_args import facts_args
from ansible_collections.torchherd.cluster.plugins.filter.start_args import start_args
from ansible_collections.torchherd.cluster.plugins.modules import node_facts, torchrun_job
from tests.unit.plugins.filter.test_schedule import GROUPS, HOSTVARS, plan, planned, schedule


def options(module):
    """The options of a module: its ARGUMENT_SPEC, or the argument_spec its main() gives."""
    spec = getattr(module, "ARGUMENT_SPEC", None)
    if spec:
        return set(spec)
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec":
            return {k.arg for k in node.value.keywords}
    raise AssertionError(f"no argument spec in {module.__name__}")


def gate(p, nprocs=None, **more):
    hosts = [n["host"] for n in p["nodes"]]
    nprocs = nprocs or dict.fromkeys(hosts, 2)
    distinct = set(nprocs.values())
    return {"interfaces": {}, "node_env": {}, "backend": "gloo", "nprocs": nprocs,
            "nproc_per_node": distinct.pop() if len(distinct) == 1 else None,
            "master_port": 29511, **more}


def start(p, s, g, i=0, facts=None, **kw):
    node = p["nodes"][i]
    return start_args(p, s, g, node, facts or {}, node["host"], **kw)


def test_a_plain_start_names_only_options_of_the_module():
    p = planned(env={"A": "1"})
    s = schedule(p, 4)
    g = gate(p, interfaces={"n0": {"name": "eth1", "address": "10.0.0.1"}},
             node_env={"n0": {"NCCL_IB_HCA": "=mlx5_0:1", "A": "node"}})
    master = start(p, s, g, 0, {"torch": {"version": "2.13.0", "gpu_count": 0}})
    assert set(master) <= options(torchrun_job)
    assert master["state"] == "started" and master["run_id"] == "r1" and master["restart"] == 0
    assert master["nproc_per_node"] == 2 and master["node_nprocs"] == []
    assert master["master_port"] == 29511 and master["node_rank"] == 0
    assert master["use_cpu"] and master["torch_version"] == "2.13.0"
    # The interface's names, then what the gate derived, then the job's own env, which wins.
    assert master["env"] == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1",
                             "NCCL_IB_HCA": "=mlx5_0:1", "A": "1", "TORCHHERD_BACKEND": "gloo"}
    assert master["barrier"] == {"listen": True, "expect": 4, "timeout": p["job"]["probe_timeout"],
                                 "window": p["job"]["probe_window"], "source": "10.0.0.1",
                                 "background": False}
    assert master["meta"] == {"host": "n0", "node_rank": 0, "name": p["job"]["name"]}
    # Left out, as the task's omit left them out: no standby, no firewall, no image.
    assert not {"standby", "firewall", "container"} & set(master)
    assert master["wrapper"] == [] and master["warm"] is False
    worker = start(p, s, g, 2)
    assert worker["barrier"]["listen"] is False and worker["barrier"]["source"] == ""
    assert worker["env"] == {"A": "1", "TORCHHERD_BACKEND": "gloo"}


def test_uneven_nodes_name_every_nodes_processes_in_rank_order():
    p = planned()
    g = gate(p, nprocs={"n0": 4, "n1": 2, "n2": 2, "n3": 1})
    args = start(p, schedule(p, 4), g, 1)
    assert args["nproc_per_node"] == 2 and args["node_nprocs"] == [4, 2, 2, 1]


def test_the_warm_launcher_and_the_firewall_follow_the_nodes_part():
    p = planned()
    s = schedule(p, 4)
    args = start(p, s, gate(p), 1, {"warm": {"started": True}, "euid": 0}, firewall=True)
    assert args["warm"] is True
    rules = p["nodes"][1]["firewall"]
    keys = ("peers", "mode", "ports", "backend", "persistent")
    assert args["firewall"] == {k: rules[k] for k in keys}


def test_srun_wraps_the_launcher_in_a_step_of_the_nodes_job():
    hostvars = {h: dict(hv, torchherd_slurm_job_id="42") for h, hv in HOSTVARS.items()}
    p = plan({"script": "t.py", "spawn": "srun"}, GROUPS, hostvars, run_id="r1")
    s = schedule(p, 4)
    args = start(p, s, gate(p), 1, {"warm": {"started": True}},
                 slurm={"srun": "/opt/slurm/bin/srun", "job_id": "42", "node": "c7"})
    assert args["wrapper"] == ["/opt/slurm/bin/srun", "--jobid=42", "--nodelist=c7", "--nodes=1",
                               "--ntasks=1", "--overlap", "--export=ALL", "--job-name=torchherd-r1"]
    # Under srun a step of the job starts the launcher anew: none is handed the job.
    assert args["warm"] is False


def test_a_detached_jobs_restarts_are_torchruns_with_its_standbys_starting_later():
    p = planned(restarts=2, detach=True, rdzv="c10d", nnodes="",
                restart_on=["node_lost", "exception"])
    p["nodes"][-1] = {**p["nodes"][-1], "standby": True}
    s = schedule(p, 4)
    assert s["restart"]["by"] == "torchrun"
    args = [start(p, s, gate(p), i) for i in range(4)]
    assert [a["max_restarts"] for a in args] == [s["restart"]["launcher"]] * 4
    assert [a["standby"]["delay"] for a in args] == [0, 0, 0, s["restart"]["standby_delay"]]
    assert s["restart"]["standby_delay"] > 0
    plain = start(planned(), schedule(planned(), 4), gate(planned()), 0)
    assert "standby" not in plain


def test_a_job_in_an_image_runs_what_preflight_found_there():
    p = planned(container={"image": "localhost/job:1", "volumes": ["/data:/data"]})
    facts = {"torch": {"gpu_count": 2},
             "container": {"runtime": "podman", "path": "/usr/bin/podman",
                           "image": "localhost/job:1", "id": "abc"}}
    args = start(p, schedule(p, 4), gate(p), 0, facts)
    assert args["container"] == {"runtime": "podman", "path": "/usr/bin/podman",
                                 "image": "localhost/job:1", "id": "abc", "gpus": True,
                                 "volumes": ["/data:/data"], "options": []}
    assert args["use_cpu"] is False


def test_the_facts_call_looks_at_the_port_where_the_master_may_be():
    p = planned()
    s = schedule(p, 4)
    code = {"files": ["train.py"], "hash": "h1"}
    master = facts_args(p, s, p["nodes"][0], code, "n0", 60)
    worker = facts_args(p, s, p["nodes"][1], code, "n1", 60)
    assert set(master) | {"venv"} <= options(node_facts)
    assert (master["port"], master["pick_port"]) == (29500, False)
    assert (worker["port"], worker["pick_port"]) == (0, False)
    assert master["code_files"] == ["train.py"] and master["code_expect"] == "h1"
    assert master["cache_seconds"] == 60 and master["container"] == {}
    assert master["warm"] == {"run_id": "r1", "module": "torch.distributed.run",
                              "env": p["job"]["env"], "deadline": s["start"]["deadline"]}
    # master_port auto: the master picks one; with spares every node looks (any may be master).
    auto = planned(master_port="auto")
    assert [facts_args(auto, s, n, code, n["host"], 60)["pick_port"] for n in auto["nodes"]] == \
        [True, False, False, False]
    spares = plan({"script": "t.py", "node_count": 3}, GROUPS, HOSTVARS, run_id="r1")
    assert [facts_args(spares, s, n, {}, n["host"], 60)["port"]
            for n in spares["nodes"] + spares["spares"]] == [29500] * 4


def test_no_launcher_starts_ahead_without_a_schedule_or_on_a_spare():
    p = plan({"script": "t.py", "node_count": 3}, GROUPS, HOSTVARS, run_id="r1")
    s = schedule(p, 4)
    assert facts_args(p, {}, p["nodes"][0], {}, "n0", 60)["warm"] == {}
    assert facts_args(p, s, p["spares"][0], {}, "n3", 60)["warm"] == {}
    assert facts_args(p, s, p["nodes"][0], {}, "n0", 60)["code_expect"] == ""


def test_not_a_plan_is_refused():
    with pytest.raises(AnsibleFilterError, match="expected plan"):
        start_args("plan", {}, {}, {}, {}, "n0")
    with pytest.raises(AnsibleFilterError, match="expected node"):
        facts_args(planned(), {}, None, {}, "n0", 60)
