import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from ansible_collections.torchherd.cluster.plugins.filter.redact import redact
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import job_spec

GROUPS = {"torchherd_nodes": ["a", "b", "c"], "other": ["x"]}
HOSTVARS = {
    "a": {"ansible_host": "10.0.0.1"},
    "b": {"ansible_host": "10.0.0.2"},
    "c": {"ansible_host": "c.mgmt", "torchherd_address": "10.0.1.3"},
    "x": {},
}


def run(groups=GROUPS, hostvars=HOSTVARS, generated="", **job):
    job.setdefault("script", "train.py")
    return plan(job, groups, hostvars, run_id=generated)


def fails(match, **kwargs):
    with pytest.raises(AnsibleFilterError, match=match) as info:
        run(**kwargs)
    return str(info.value)


def test_ranks_follow_inventory_order():
    p = run(nproc_per_node=2)
    assert [(n["host"], n["node_rank"]) for n in p["nodes"]] == [("a", 0), ("b", 1), ("c", 2)]
    assert p["nnodes"] == "3"
    assert p["world_size"] == 6
    assert p["master"] == {"host": "a", "addr": "10.0.0.1", "port": 29500}


def test_torchherd_address_wins_over_ansible_host_and_name_is_last_resort():
    p = run(groups={"torchherd_nodes": ["c", "x"]})
    assert [n["address"] for n in p["nodes"]] == ["10.0.1.3", "x"]


def test_defaults_come_from_the_argument_spec():
    p = run()
    assert p["job"]["master_port"] == 29500
    assert p["job"]["rdzv"] == "static"
    assert p["nproc_per_node"] == "auto" and p["world_size"] is None
    assert p["job"]["name"] == "train"
    assert set(p["job"]) == set(job_spec()["torchherd_job"]["options"])


def test_named_master_and_address_override():
    p = run(master="b", master_addr="192.168.1.2", master_port="29600")
    assert p["master"] == {"host": "b", "addr": "192.168.1.2", "port": 29600}
    # node ranks stay in inventory order; only the rendezvous moves
    assert p["nodes"][0]["host"] == "a"


def test_explicit_node_order():
    p = run(nodes=["c", "a"])
    assert [n["host"] for n in p["nodes"]] == ["c", "a"]
    assert p["master"]["host"] == "c"


def test_numeric_string_nproc_is_accepted():
    assert run(nproc_per_node="4")["world_size"] == 12


@pytest.mark.parametrize("groups", [{"torchherd_nodes": []}, {}])
def test_empty_or_missing_group(groups):
    msg = fails("node group 'torchherd_nodes'", groups=groups)
    assert "[torchherd_nodes]" in msg


def test_other_group_name_is_named():
    fails("node group 'gpu'", node_group="gpu")


def test_host_listed_twice():
    msg = fails("host a: expected each node once, found it listed 2 times", nodes=["a", "b", "a"])
    assert "fix:" in msg


def test_node_not_in_group():
    fails("host x: expected a member of group 'torchherd_nodes'", nodes=["a", "x"])


def test_two_hosts_with_the_same_address():
    hv = dict(HOSTVARS, b={"ansible_host": "10.0.0.1"})
    msg = fails(r"hosts a, b: expected one address per node, found all of them at 10.0.0.1",
                hostvars=hv)
    assert "ansible_host" in msg


@pytest.mark.parametrize("port", [0, -1, 65536, 70000, "70000"])
def test_port_out_of_range(port):
    fails("job.master_port: expected an integer in 1..65535", master_port=port)


def test_master_port_auto_is_left_to_the_master_in_preflight():
    p = run(master_port="auto")
    assert p["master"] == {"host": "a", "addr": "10.0.0.1", "port": "auto"}
    assert p["job"]["master_port"] == "auto"
    # A firewall in mode ports would need the port in its rules before preflight picked it.
    fails(r"job.master_port: expected a port number with firewall_mode ports .* on a\), found "
          r"auto; fix: give master_port a free port, or use firewall_mode members",
          master_port="auto", firewall_mode="ports", firewall_ports=["50000-50999"])
    assert run(master_port="auto", firewall_mode="ports", firewall=False)


@pytest.mark.parametrize("port", ["http", "29500x", 1.5, True])
def test_port_not_an_integer_is_refused_in_the_plans_words(port):
    fails(r"job.master_port: expected an integer in 1..65535 or 'auto', found "
          + re.escape(repr(port)), master_port=port)


def test_a_job_that_skipped_role_validation_is_refused_not_crashed_on():
    fails(r"Validation of arguments failed:\n.*\ntorchherd_job\.nproc\. Supported parameters",
          nproc=2, firewall="maybe")


@pytest.mark.parametrize("port", [1, 1024, 65535, "29501"])
def test_port_in_range(port):
    assert run(master_port=port)["master"]["port"] == int(port)


@pytest.mark.parametrize("nproc", [0, -2, "zero", "", "2.5", 1.5, True, False, [2], "Auto"])
def test_bad_nproc_per_node(nproc):
    fails("job.nproc_per_node: expected a positive integer or 'auto'", nproc_per_node=nproc)


def test_unknown_master():
    fails("job.master: expected one of the nodes", master="zz")


def test_missing_script():
    fails("job.script: expected the training script", script="")
    fails("job.script: expected the training script", script=None)


def test_verify_without_a_job_plans_the_nodes():
    p = plan({}, GROUPS, HOSTVARS, playbook="verify")
    assert [n["host"] for n in p["nodes"]] == ["a", "b", "c"] and p["job"]["script"] == ""
    with pytest.raises(AnsibleFilterError, match="job.script: expected"):
        plan({}, GROUPS, HOSTVARS, playbook="launch")


def test_every_problem_is_reported_at_once():
    hv = dict(HOSTVARS, b={"ansible_host": "10.0.0.1"})
    msg = fails("cannot start", hostvars=hv, master_port=0, nproc_per_node=0)
    assert msg.count("\n  - ") == 3


def test_elastic_range():
    p = run(rdzv="c10d", nnodes="2:3")
    assert p["nnodes"] == "2:3"
    fails("expected MIN <= 3 nodes <= MAX", rdzv="c10d", nnodes="1:2")
    fails("expected MIN:MAX", rdzv="c10d", nnodes="3:2")
    fails("expected it empty with rdzv 'static'", nnodes="2:3")


def test_run_id_must_be_path_safe():
    fails("job.run_id: expected letters", run_id="../etc")
    assert run(run_id="exp-1.2_a")["run_id"] == "exp-1.2_a"


def test_not_a_dict():
    with pytest.raises(AnsibleFilterError, match="expected a dict"):
        plan(["script"], GROUPS, HOSTVARS)


def test_the_plan_keeps_secret_names_and_never_their_values():
    job = {"script": "train.py", "env": {"A": "1"}, "secret_env": {"TOKEN": "hunter2"}}
    # The job as extra vars: every node sees it.
    p = plan(job, GROUPS, {h: {**hv, "torchherd_job": job} for h, hv in HOSTVARS.items()})
    # The plan is a fact (shown at -v, recorded by result callbacks) and plan.json as it is.
    assert p["job"]["secret_env"] == {"TOKEN": "********"}
    assert "hunter2" not in repr(p)
    assert p["job"]["env"] == {"A": "1"}
    assert redact(p) == p
    # The start takes the values from the job itself: the plan leaves it as it was.
    assert job["secret_env"] == {"TOKEN": "hunter2"}


def test_redact_hides_secret_values_only_at_any_depth():
    data = {"job": {"env": {"A": "1"}, "secret_env": {"T": "s3", "N": 42}},
            "runs": [{"secret_env": {"K": "v"}, "secret": "not a secret_env"}]}
    assert redact(data) == {"job": {"env": {"A": "1"}, "secret_env": {"T": "********",
                                                                      "N": "********"}},
                            "runs": [{"secret_env": {"K": "********"},
                                      "secret": "not a secret_env"}]}
    assert data["job"]["secret_env"]["T"] == "s3"


def test_a_refused_job_does_not_show_its_secret_values():
    message = fails("job.master_port", master_port=70000, secret_env={"TOKEN": "hunter2"})
    assert "hunter2" not in message
    message = fails("argument 'secret_env' is of type list", secret_env=["TOKEN=hunter2"])
    assert "hunter2" not in message


def test_srun_spawn_needs_slurm_nodes():
    fails("job.spawn: expected nodes of a SLURM job", spawn="srun")
    hv = {h: dict(v, torchherd_slurm_job_id="42") for h, v in HOSTVARS.items()}
    assert run(hostvars=hv, spawn="srun")["job"]["spawn"] == "srun"
    # A spare outside the job (node_count 2 of 3) may take a node's place: it is checked too.
    hv["c"] = HOSTVARS["c"]
    fails("found c outside one", hostvars=hv, spawn="srun", node_count=2)


def test_launchers_other_than_torchrun_take_a_static_rendezvous_and_no_planned_options():
    job = run(launcher="accelerate", launcher_args=["--config_file", "acc.yaml"])["job"]
    assert job["launcher"] == "accelerate" and job["launcher_args"][0] == "--config_file"
    assert run()["job"]["launcher"] == "torchrun"
    fails("job.rdzv: expected static with launcher accelerate", launcher="accelerate",
          rdzv="c10d", nnodes="2:3")
    fails("job.launcher_args: expected options of accelerate that the plan does not set, "
          "found --machine_rank", launcher="accelerate", launcher_args=["--machine_rank=2"])
    fails("found --master_port", launcher="deepspeed", launcher_args=["--master_port", "1"])
    fails("found --nnodes", launcher_args=["--nnodes", "4"])
    fails("value of launcher must be one of: torchrun, accelerate, deepspeed", launcher="pdsh")


def test_firewall_ports_mode_needs_ports():
    fails("job.firewall_ports: expected the ports gloo and NCCL use", firewall_mode="ports")
    pinned = run(firewall_mode="ports", firewall_ports=["50000-50999"])
    assert pinned["job"]["firewall_ports"] == ["50000-50999"]
    assert run(firewall_mode="ports", firewall=False)
    assert run(groups={"torchherd_nodes": ["a"]}, firewall_mode="ports")


def test_run_id_argument_unless_the_job_names_one():
    assert run(generated="20250101-120000-0a1b")["run_id"] == "20250101-120000-0a1b"
    assert run(generated="20250101-120000-0a1b", run_id="mine")["run_id"] == "mine"
    assert run()["run_id"] == ""
    fails("job.run_id: expected letters", generated="../x")


def test_derived_values_per_node():
    hv = dict(HOSTVARS, a=dict(HOSTVARS["a"], torchherd_root="/scratch/th",
                               ansible_python_interpreter="/usr/bin/python3"))
    a, b, c = run(hostvars=hv, name="exp")["nodes"]
    assert (a["root"], a["code_dir"], a["python"]) == (
        "/scratch/th", "/scratch/th/code/exp", "/usr/bin/python3")
    assert (b["root"], b["code_dir"], b["python"]) == ("~/.torchherd", "~/.torchherd/code/exp", "")
    assert a["firewall"] == {"enabled": True, "mode": "members", "ports": ["29500"],
                             "peers": ["10.0.0.2", "10.0.1.3"], "backend": "auto",
                             "persistent": False, "become": True}
    assert b["firewall"]["ports"] == [] and b["firewall"]["peers"] == ["10.0.0.1", "10.0.1.3"]


def test_the_jobs_python_and_code_dest_win_over_the_hosts():
    hv = dict(HOSTVARS, a=dict(HOSTVARS["a"], ansible_python_interpreter="/usr/bin/python3"))
    node = run(hostvars=hv, python="/opt/venv/bin/python", code_dest="/srv/code")["nodes"][0]
    assert (node["python"], node["code_dir"]) == ("/opt/venv/bin/python", "/srv/code")


def test_job_firewall_values_coerced_as_ansible_does():
    nodes = run(firewall="off", firewall_persistent="yes", firewall_mode="ports",
                firewall_ports=[50000, "51000-51999"], master="b")["nodes"]
    assert [n["firewall"]["enabled"] for n in nodes] == [False, False, False]
    assert nodes[0]["firewall"]["persistent"] is True
    assert nodes[0]["firewall"]["ports"] == ["50000", "51000-51999"]
    assert nodes[1]["firewall"]["ports"] == ["29500", "50000", "51000-51999"]


def test_host_firewall_settings_from_an_ini_inventory_are_coerced():
    # An INI inventory gives every value as a string.
    hv = dict(HOSTVARS, b=dict(HOSTVARS["b"], torchherd_firewall_enabled="false",
                               torchherd_firewall_persistent="1", torchherd_firewall_become="no",
                               torchherd_firewall_backend="ufw", torchherd_firewall_mode="ports",
                               torchherd_firewall_ports="50000-50999,52000"))
    a, b, _ = run(hostvars=hv, firewall_ports=["60000"])["nodes"]
    assert b["firewall"] == {"enabled": False, "mode": "ports", "ports": ["50000-50999", "52000"],
                             "peers": ["10.0.0.1", "10.0.1.3"], "backend": "ufw",
                             "persistent": True, "become": False}
    assert a["firewall"]["enabled"] is True and a["firewall"]["ports"] == ["29500", "60000"]


def test_host_firewall_setting_that_is_no_boolean_is_named():
    hv = dict(HOSTVARS, c=dict(HOSTVARS["c"], torchherd_firewall_enabled="maybe"))
    msg = fails("host c: torchherd_firewall_enabled: The value 'maybe' is not a valid boolean",
                hostvars=hv)
    assert "fix: correct it in the inventory" in msg


def test_a_host_in_mode_ports_needs_ports_too():
    hv = dict(HOSTVARS, c=dict(HOSTVARS["c"], torchherd_firewall_mode="ports"))
    fails("job.firewall_ports: expected the ports gloo and NCCL use", hostvars=hv)
    hv["c"]["torchherd_firewall_ports"] = ["50000-50999"]
    assert run(hostvars=hv)["nodes"][2]["firewall"]["ports"] == ["50000-50999"]


def test_nodes_set_their_own_python_code_dir_process_count_and_interface():
    hostvars = {
        "a": {"ansible_host": "10.0.0.1", "ansible_python_interpreter": "/usr/bin/python3"},
        "b": {"ansible_host": "10.0.0.2", "torchherd_python": "/opt/other/bin/python",
              "torchherd_code_dest": "/scratch/code", "torchherd_nproc_per_node": "2",
              "torchherd_socket_ifname": "ib0"},
        "c": {"ansible_host": "10.0.0.3", "torchherd_nproc_per_node": 3},
    }
    p = run(hostvars=hostvars, nproc_per_node=1, python="/venv/bin/python", socket_ifname="eth1")
    nodes = {n["host"]: n for n in p["nodes"]}
    assert nodes["a"]["python"] == "/venv/bin/python"
    assert nodes["b"]["python"] == "/opt/other/bin/python"
    assert nodes["b"]["code_dir"] == "/scratch/code"
    assert nodes["a"]["code_dir"] == "~/.torchherd/code/train"
    assert [nodes[h]["nproc_per_node"] for h in "abc"] == [1, 2, 3]
    assert [nodes[h]["interface"] for h in "abc"] == ["eth1", "ib0", "eth1"]
    assert p["world_size"] == 6 and p["nproc_per_node"] is None


def test_a_bad_process_count_of_a_node_is_named():
    hostvars = dict(HOSTVARS, b={"ansible_host": "10.0.0.2", "torchherd_nproc_per_node": "0"})
    message = fails("torchherd_nproc_per_node", hostvars=hostvars)
    assert "host b" in message


def test_accelerate_needs_the_same_process_count_everywhere():
    hostvars = dict(HOSTVARS, b={"ansible_host": "10.0.0.2", "torchherd_nproc_per_node": 2})
    fails("same count on every node with launcher accelerate", hostvars=hostvars,
          nproc_per_node=1, launcher="accelerate")


def test_an_absolute_script_inside_code_src_runs_relative_to_the_code_directory(tmp_path):
    # The nodes run the script in their copy of code_src: the controller's path means nothing
    # there.
    (tmp_path / "code" / "jobs").mkdir(parents=True)
    p = run(script=str(tmp_path / "code" / "jobs" / "train.py"), code_src=str(tmp_path / "code"))
    assert p["job"]["script"] == "jobs/train.py"
    assert p["job"]["name"] == "train"
    # code_src through a link, and a script that links out of it, are the code's all the same.
    (tmp_path / "link").symlink_to(tmp_path / "code")
    (tmp_path / "code" / "run.py").symlink_to(tmp_path / "elsewhere.py")
    assert run(script=str(tmp_path / "code" / "run.py"),
               code_src=str(tmp_path / "link"))["job"]["script"] == "run.py"
    # A relative script is the user's as given.
    assert run(script="jobs/train.py", code_src=str(tmp_path / "code"))["job"]["script"] \
        == "jobs/train.py"


def test_an_absolute_script_outside_code_src_is_refused_before_any_node(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "codex").mkdir()  # a sibling whose name starts like code_src's is outside it
    for outside in (tmp_path / "elsewhere" / "train.py", tmp_path / "codex" / "train.py"):
        msg = fails("job.script: expected a path inside code_src", script=str(outside),
                    code_src=str(tmp_path / "code"))
        assert f"code_src {tmp_path / 'code'} (the directory synced to the nodes), " \
               f"found {outside}; fix: put the script under code_src" in msg


def test_the_job_reaches_the_validator_as_plain_data():
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import _plain

    class Tagged(str):
        """Stands for the tagged strings Ansible hands a filter (a str subclass)."""

    found = _plain({Tagged("env"): {"A": Tagged("1")}, "args": (Tagged("--x"), 2, True),
                    "nproc_per_node": Tagged("auto"), "timeout": 1.5, "none": None})
    assert found == {"env": {"A": "1"}, "args": ["--x", 2, True], "nproc_per_node": "auto",
                     "timeout": 1.5, "none": None}
    assert all(type(v) is str for v in (*found["env"], found["env"]["A"], found["args"][0]))
    assert type(found["args"][2]) is bool and type(found["args"][1]) is int


# A limit (ansible-playbook's --limit): the hosts it matches, as the plan role queries them.
SPARED = {**HOSTVARS, "s": {"ansible_host": "10.0.0.9", "torchherd_spare": "true"}}
WITH_SPARE = {"torchherd_nodes": ["a", "b", "c", "s"]}


def limited(hosts, groups=WITH_SPARE, hostvars=SPARED, **job):
    pattern = ",".join([*hosts, "localhost"])
    return plan({"script": "train.py", **job}, groups, hostvars, run_id="r1", limit=pattern,
                limit_hosts=[*hosts, "localhost"])


def test_a_limit_that_leaves_out_a_spare_keeps_every_rank():
    p = limited(["a", "b", "c"])
    assert [(n["host"], n["node_rank"]) for n in p["nodes"]] == [("a", 0), ("b", 1), ("c", 2)]
    # The spare is checked nowhere (ansible-playbook does not reach it), and said why.
    assert p["spares"] == [] and p["excluded"] == {"s": "outside the limit a,b,c,localhost"}
    assert p["world_size"] is None and p["nnodes"] == "3"


def test_without_a_limit_the_spare_waits_behind_the_nodes():
    p = plan({"script": "train.py"}, WITH_SPARE, SPARED, run_id="r1")
    assert [n["host"] for n in p["spares"]] == ["s"] and p["excluded"] == {}


def test_a_spare_within_the_limit_takes_the_rank_of_a_node_outside_it():
    p = limited(["a", "c", "s"])
    assert [(n["host"], n["node_rank"]) for n in p["nodes"]] == [("a", 0), ("s", 1), ("c", 2)]
    assert p["excluded"] == {"b": "outside the limit a,c,s,localhost"}


@pytest.mark.parametrize("extra", [{}, {"min_node_count": 1, "rdzv": "c10d"}])
def test_a_limit_that_leaves_out_a_needed_node_is_refused_naming_it_the_limit_and_the_fix(extra):
    """A limit does not make the job smaller: not even where min_node_count would allow it."""
    with pytest.raises(AnsibleFilterError) as info:
        limited(["a", "c"], groups=GROUPS, hostvars=HOSTVARS, **extra)
    assert ("host b: expected within the limit a,c,localhost (the job's 3 nodes), found it "
            "outside, and no spare within the limit to take its place; fix: widen the limit to "
            "take in b, set job.node_count to 2 (the hosts within the limit), or mark a host "
            "within it torchherd_spare") in str(info.value)


def test_every_node_the_limit_leaves_out_is_named():
    with pytest.raises(AnsibleFilterError, match=r"hosts a, c: expected within the limit "
                                                  r"b,localhost .* found them outside"):
        limited(["b"], groups=GROUPS, hostvars=HOSTVARS)


def test_the_fix_the_limit_refusal_gives_works():
    # node_count 2: the host within the limit that waited by count takes the place.
    p = limited(["a", "c"], groups=GROUPS, hostvars=HOSTVARS, node_count=2)
    assert [(n["host"], n["node_rank"]) for n in p["nodes"]] == [("a", 0), ("c", 1)]


def test_a_host_outside_the_limit_is_no_candidate():
    """Its settings are not checked: the address it shares with a node, its process count."""
    hostvars = {**SPARED, "s": {"ansible_host": "10.0.0.1", "torchherd_spare": "true",
                                "torchherd_nproc_per_node": "many"}}
    assert limited(["a", "b", "c"], hostvars=hostvars, nproc_per_node=2)["world_size"] == 6
    with pytest.raises(AnsibleFilterError, match="one address per node"):
        plan({"script": "train.py"}, WITH_SPARE, hostvars, run_id="r1")


# An inline host list (-i node1,node2,): Ansible puts its hosts in no group but ungrouped.
INLINE = {"all": ["x", "y"], "ungrouped": ["x", "y"]}


def test_an_inline_host_lists_hosts_are_the_nodes():
    p = run(groups=INLINE)
    assert [(n["host"], n["node_rank"]) for n in p["nodes"]] == [("x", 0), ("y", 1)]
    assert [n["host"] for n in run(groups=INLINE, nodes=["y", "x"])["nodes"]] == ["y", "x"]


@pytest.mark.parametrize("groups", [
    {"all": [], "ungrouped": []},
    # Groups of its own: an ungrouped host there is no node (a login node, say).
    {"all": ["x", "y"], "ungrouped": ["x"], "gpu": ["y"]},
    # The node group there, empty: the inventory's own choice.
    {"all": ["x"], "ungrouped": ["x"], "torchherd_nodes": []},
])
def test_without_the_node_group_or_an_inline_host_list_both_are_named(groups):
    msg = fails("node group 'torchherd_nodes': expected at least one host", groups=groups)
    assert "no inline host list (-i node1,node2,: hosts in no group)" in msg
    assert "fix: list the nodes under [torchherd_nodes] in the inventory, give them as -i " \
           "node1,node2, or set torchherd_job.node_group" in msg


def test_a_node_group_the_job_names_is_not_replaced_by_ungrouped_hosts():
    msg = fails("node group 'gpu'", groups=INLINE, node_group="gpu")
    assert "inline" not in msg


def test_a_secret_that_a_node_does_not_see_is_refused_by_name():
    """Each node's start takes a secret's value from the job as that node sees it: a job given
    for localhost alone names the secret in the plan and starts without it. Names only."""
    job = {"script": "train.py", "secret_env": {"TOKEN": "hunter2"}}
    seen = {"torchherd_job": job}
    hostvars = {"n1": {**seen}, "n2": {"torchherd_job": {"script": "train.py"}}}
    with pytest.raises(AnsibleFilterError) as err:
        plan(job, {"torchherd_nodes": ["n1", "n2"]}, hostvars)
    message = str(err.value)
    assert "hosts n2: job.secret_env: expected TOKEN in the job each node sees" in message
    assert "n1" not in message.split("hosts ")[1].split(":")[0]
    assert "hunter2" not in message
    # Every node sees it (extra vars, group_vars of the nodes): planned.
    both = {"n1": {**seen}, "n2": {**seen}}
    assert plan(job, {"torchherd_nodes": ["n1", "n2"]}, both)["job"]["secret_env"] == {
        "TOKEN": "********"}
