"""Spare nodes: the plan's candidates, and the choice after preflight's verdict."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.choose_nodes import choose_nodes
from ansible_collections.torchherd.cluster.plugins.filter.plan import plan

GROUPS = {"torchherd_nodes": ["n0", "n1", "n2", "n3"]}


def hostvars(spares=("n3",)):
    hv = {f"n{i}": {"ansible_host": f"10.0.0.{i + 1}"} for i in range(4)}
    for name in spares:
        hv[name]["torchherd_spare"] = "true"  # an INI inventory's string
    return hv


def job(**extra):
    return {"script": "train.py", "nproc_per_node": 2, **extra}


def problem(host, check="torch", found="ModuleNotFoundError"):
    return {"host": host, "check": check, "expected": "x", "found": found, "fix": "y"}


def hosts(entries):
    return [(n["host"], n["node_rank"]) for n in entries]


def choose(problems, spares=("n3",), **extra):
    hv = hostvars(spares)
    first = plan(job(**extra), GROUPS, hv, run_id="r1")
    return first, choose_nodes(first, {"problems": problems}, GROUPS, hv)


def test_spares_wait_behind_the_nodes_without_a_rank():
    p = plan(job(), GROUPS, hostvars(), run_id="r1")
    assert hosts(p["nodes"]) == [("n0", 0), ("n1", 1), ("n2", 2)]
    assert hosts(p["spares"]) == [("n3", None)]
    assert p["nnodes"] == "3" and p["world_size"] == 6 and p["min_nodes"] == 3


def test_node_count_takes_the_first_nodes_not_marked_spare_first():
    p = plan(job(node_count=2), GROUPS, hostvars(spares=("n0",)), run_id="r1")
    assert hosts(p["nodes"]) == [("n1", 0), ("n2", 1)]
    assert [n["host"] for n in p["spares"]] == ["n3", "n0"]
    assert p["master"]["host"] == "n1"


def test_without_spares_or_node_count_every_node_runs():
    p = plan(job(), GROUPS, hostvars(spares=()), run_id="r1")
    assert len(p["nodes"]) == 4 and p["spares"] == []
    assert choose_nodes(p, {"problems": [problem("n1")]}, GROUPS, hostvars(())) is p


def test_a_healthy_spare_takes_the_rank_of_the_failed_node():
    _, chosen = choose([problem("n1")])
    assert hosts(chosen["nodes"]) == [("n0", 0), ("n3", 1), ("n2", 2)]
    assert chosen["spares"] == []
    assert chosen["left_out"] == {"n1": "torch: ModuleNotFoundError"}
    assert chosen["world_size"] == 6 and chosen["nnodes"] == "3"


def test_a_failed_master_hands_the_master_to_the_first_chosen_node():
    _, chosen = choose([problem("n0", "ssh", "unreachable")])
    assert chosen["master"] == {"host": "n3", "addr": "10.0.0.4", "port": 29500}
    by_host = {n["host"]: n for n in chosen["nodes"]}
    # The master port's rule moves with the master; peers are the chosen nodes only.
    assert by_host["n3"]["firewall"]["ports"] == ["29500"]
    assert by_host["n1"]["firewall"]["ports"] == []
    assert sorted(by_host["n1"]["firewall"]["peers"]) == ["10.0.0.3", "10.0.0.4"]


def test_a_spare_not_needed_is_left_out_as_such():
    _, chosen = choose([])
    assert hosts(chosen["nodes"]) == [("n0", 0), ("n1", 1), ("n2", 2)]
    assert chosen["left_out"] == {"n3": "a spare the job did not need"}


def test_an_unhealthy_spare_is_named_with_its_problem():
    _, chosen = choose([problem("n3", "disk", "1 GiB")])
    assert chosen["left_out"] == {"n3": "disk: 1 GiB"}
    assert [n["host"] for n in chosen["nodes"]] == ["n0", "n1", "n2"]


def test_too_few_healthy_nodes_leave_the_plan_to_the_gate():
    first, chosen = choose([problem("n1"), problem("n3")])
    assert chosen is first


def test_min_node_count_runs_on_fewer_nodes():
    _, chosen = choose([problem("n1"), problem("n3")], min_node_count=2)
    assert hosts(chosen["nodes"]) == [("n0", 0), ("n2", 1)]
    assert chosen["nnodes"] == "2" and chosen["world_size"] == 4
    assert set(chosen["left_out"]) == {"n1", "n3"}


def test_a_problem_between_nodes_is_no_node_s_own():
    first, chosen = choose([problem("n0 -> n1", "master reachable")])
    assert chosen is first


def test_a_failed_master_named_by_the_job_is_not_replaced():
    first, chosen = choose([problem("n0")], master="n0")
    assert chosen is first


@pytest.mark.parametrize(("extra", "match"), [
    ({"node_count": 5}, r"job.node_count: expected 1..4"),
    ({"node_count": 2, "min_node_count": 3}, r"job.min_node_count: expected 0..2"),
])
def test_counts_out_of_range_are_refused(extra, match):
    with pytest.raises(AnsibleFilterError, match=match):
        plan(job(**extra), GROUPS, hostvars(), run_id="r1")


def test_a_bad_spare_marking_is_named():
    hv = hostvars(())
    hv["n2"]["torchherd_spare"] = "perhaps"
    with pytest.raises(AnsibleFilterError, match="host n2: torchherd_spare"):
        plan(job(), GROUPS, hv, run_id="r1")


def test_an_excluded_node_s_place_goes_to_a_spare():
    p = plan(job(), GROUPS, hostvars(), run_id="r1", exclude={"n1": "restart 1: lost"})
    assert hosts(p["nodes"]) == [("n0", 0), ("n3", 1), ("n2", 2)] and p["spares"] == []
    assert p["excluded"] == {"n1": "restart 1: lost"}


def test_without_a_spare_an_excluded_node_leaves_fewer_only_where_allowed():
    with pytest.raises(AnsibleFilterError, match=r"nodes: expected at least 3"):
        plan(job(), GROUPS, hostvars(), run_id="r1", exclude={"n1": "x", "n3": "y"})
    p = plan(job(min_node_count=2), GROUPS, hostvars(), run_id="r1",
             exclude={"n1": "x", "n3": "y"})
    assert hosts(p["nodes"]) == [("n0", 0), ("n2", 1)] and p["world_size"] == 4


def test_the_chosen_plan_names_the_excluded_nodes_too():
    hv = hostvars(spares=("n2", "n3"))
    first = plan(job(node_count=2), GROUPS, hv, run_id="r1", exclude={"n0": "lost"})
    chosen = choose_nodes(first, {"problems": []}, GROUPS, hv)
    assert chosen["left_out"] == {"n0": "lost", "n3": "a spare the job did not need"}


DETACHED = {"detach": True, "restarts": 1, "rdzv": "c10d",
            "restart_on": ["node_lost", "connection", "exception"]}


def test_a_detached_job_with_restarts_keeps_its_healthy_spares_as_standbys():
    first, chosen = choose([], **DETACHED)
    assert first["nnodes"] == "3:3" and hosts(first["spares"]) == [("n3", None)]
    assert hosts(chosen["nodes"]) == [("n0", 0), ("n1", 1), ("n2", 2), ("n3", 3)]
    assert [n.get("standby", False) for n in chosen["nodes"]] == [False, False, False, True]
    # The standby is not counted: torchrun's rendezvous is full without it.
    assert chosen["nnodes"] == "3:3" and chosen["world_size"] == 6
    assert chosen["left_out"] == {} and chosen["spares"] == []


def test_a_standby_is_what_is_left_after_the_spares_took_failed_places():
    _, chosen = choose([problem("n1")], spares=("n3", "n2"), node_count=2,
                       min_node_count=1, **DETACHED)
    # n0 and n1 are the job's; n2 (the first spare) takes n1's place, n3 is the standby left.
    assert hosts(chosen["nodes"]) == [("n0", 0), ("n2", 1), ("n3", 2)]
    assert chosen["nodes"][-1]["standby"] and chosen["nnodes"] == "1:2"
    assert chosen["left_out"] == {"n1": "torch: ModuleNotFoundError"}


def test_without_restarts_or_detach_a_spare_not_needed_is_left_out_as_before():
    _, chosen = choose([], detach=True, rdzv="c10d")
    assert len(chosen["nodes"]) == 3 and not any(n.get("standby") for n in chosen["nodes"])
    assert chosen["left_out"] == {"n3": "a spare the job did not need"}


@pytest.mark.parametrize(("extra", "found"), [
    ({"rdzv": "static"}, "expected launcher torchrun with rdzv c10d"),
    ({"launcher": "accelerate"}, "found launcher accelerate with rdzv c10d"),
    ({"restart_on": ["node_lost"]}, "job.restart_on with detach: expected it to name exception"),
    ({"max_restarts": 3}, "job.max_restarts with detach and restarts: expected 0 or 1"),
    ({"nnodes": "2:4"}, "job.nnodes: expected MAX 3 with detached restarts"),
])
def test_a_detached_job_whose_restarts_torchrun_cannot_make_is_refused(extra, found):
    with pytest.raises(AnsibleFilterError, match=found) as raised:
        plan(job(**{**DETACHED, **extra}), GROUPS, hostvars(), run_id="r1")
    assert "fix:" in str(raised.value)
