"""The preflight gate on recorded facts, GPU cases included (these machines have no GPU)."""

import copy

import pytest

from ansible_collections.torchherd.cluster.plugins.filter.gate import gate
from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate import NODE_CHECKS
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.answered import answered
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.disk import disk
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.environment import (
    interpreter,
    py_spy,
    rsync,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.gpus import duplicate_gpus
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.network import (
    firewall_without_root,
    reachable,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.procs import (
    _backend,
    _nprocs,
    backend_available,
    same_gpu_count,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.running import run_id_free
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.versions import (
    DEFAULT_MATCH,
    _match_keys,
    launcher_installed,
    versions_match,
)

CPU = {
    "hostname": "n0", "root": "/root/.torchherd", "rsync": "/usr/bin/rsync",
    "python": {"path": "/usr/bin/python3", "version": "3.11.2", "error": None},
    "torch": {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "gpu_count": 0,
              "gpus": [], "nccl": None, "nccl_available": False, "gloo_available": True,
              "error": None},
    "port_free": True, "disk_free_bytes": 50 << 30, "running_jobs": {},
    "addresses": {"eth0": ["10.0.0.1"]},
}


def gpu_facts(hostname, count, uuid_prefix=None, nccl="2.27.5"):
    facts = copy.deepcopy(CPU)
    facts["hostname"] = hostname
    facts["torch"].update(version="2.13.0+cu130", cuda="13.0", cuda_available=True,
                          gpu_count=count, nccl=nccl, nccl_available=True)
    facts["torch"]["gpus"] = [
        {"index": i, "name": "NVIDIA H100", "memory_bytes": 80 << 30,
         "uuid": f"GPU-{uuid_prefix or hostname}-{i}"} for i in range(count)]
    return facts


def make(hosts_facts, **job):
    hosts = list(hosts_facts)
    hostvars = {h: {"ansible_host": f"10.0.0.{i + 1}", "torchherd_facts": f}
                for i, (h, f) in enumerate(hosts_facts.items())}
    job.setdefault("script", "train.py")
    p = plan(job, {"torchherd_nodes": hosts}, hostvars)
    p["run_id"] = "r1"
    return hosts, hostvars, p


def checks(verdict):
    return sorted((p["host"], p["check"]) for p in verdict["problems"])


def cpu(hostname):
    facts = copy.deepcopy(CPU)
    facts["hostname"] = hostname
    return facts


def test_healthy_cpu_cluster_resolves_auto_to_one_process():
    verdict = gate(*make({"a": cpu("a"), "b": cpu("b")}))
    assert verdict["ok"] and verdict["problems"] == []
    assert verdict["nproc_per_node"] == 1 and verdict["world_size"] == 2
    assert verdict["backend"] == "gloo"
    assert "2.13.0+cpu" in verdict["table"]


def test_gpu_cluster_resolves_auto_to_gpu_count_and_nccl():
    verdict = gate(*make({"a": gpu_facts("a", 8), "b": gpu_facts("b", 8)}))
    assert verdict["ok"], verdict["table"]
    assert verdict["nproc_per_node"] == 8 and verdict["world_size"] == 16
    assert verdict["backend"] == "nccl"


def test_unreachable_node_is_named():
    hosts, hv, p = make({"a": cpu("a"), "b": cpu("b")})
    hv["b"]["torchherd_facts"] = {"unreachable": True, "msg": "Task failed: Data could not be "
                                  "sent ... over ssh: ssh: connect to host 10.0.0.2 port 22: "
                                  "Connection refused"}
    hv["b"]["inventory_file"] = "/home/me/clusters/a100.ini"
    verdict = gate(hosts, hv, p)
    assert checks(verdict) == [("b", "ssh")]
    assert verdict["problems"][0]["found"].startswith("ssh: connect to host 10.0.0.2")
    # The fix names the inventory given, not a placeholder.
    assert "(ansible -m ping -i /home/me/clusters/a100.ini b)" in verdict["problems"][0]["fix"]


def test_no_torch():
    facts = cpu("b")
    facts["torch"] = {"version": None, "error": "ModuleNotFoundError: No module named 'torch'"}
    verdict = gate(*make({"a": cpu("a"), "b": facts}))
    assert checks(verdict) == [("b", "torch")]
    assert "pip install torch" in verdict["problems"][0]["fix"]


def test_a_torch_probe_out_of_time_is_named_as_such_not_as_a_missing_version():
    facts = cpu("b")
    facts["python"] = {"path": "/usr/bin/python3", "version": None, "error": None}
    facts["torch"] = {"version": None,
                      "error": "importing torch in /usr/bin/python3 took more than 60 s"}
    verdict = gate(*make({"a": cpu("a"), "b": facts}))
    assert checks(verdict) == [("b", "torch")]
    assert verdict["problems"][0]["found"].endswith("took more than 60 s")
    assert "fewer forks" in verdict["problems"][0]["fix"]


def test_interpreter_missing():
    facts = cpu("b")
    facts["python"] = {"path": "/opt/venv/bin/python", "version": None,
                       "error": "interpreter /opt/venv/bin/python not found"}
    facts["torch"] = {"version": None, "error": "interpreter /opt/venv/bin/python not found"}
    verdict = gate(*make({"a": cpu("a"), "b": facts}))
    assert checks(verdict) == [("b", "python")]


@pytest.mark.parametrize("key,value,check,found", [
    ("python.version", "3.10.12", "python.minor", "3.10"),
    ("torch.version", "2.12.0+cpu", "torch.version", "2.12.0+cpu"),
])
def test_versions_must_match_the_master(key, value, check, found):
    facts = cpu("b")
    section, field = key.split(".")
    facts[section][field] = value
    verdict = gate(*make({"a": cpu("a"), "b": facts, "c": cpu("c")}))
    assert checks(verdict) == [("b", f"same {check}")]
    problem = verdict["problems"][0]
    assert problem["found"] == found and "(as on a)" in problem["expected"]


def test_another_python_patch_release_does_not_break_a_job():
    facts = cpu("b")
    facts["python"]["version"] = "3.11.9"
    verdict = gate(*make({"a": cpu("a"), "b": facts}))
    assert verdict["ok"], verdict["problems"]


def test_nodes_with_their_own_process_counts():
    hosts, hostvars, p = make({"a": cpu("a"), "b": cpu("b"), "c": cpu("c")}, nproc_per_node=1)
    hostvars["b"]["torchherd_nproc_per_node"] = 2
    hostvars["c"]["torchherd_nproc_per_node"] = "3"
    p = plan({"script": "train.py", "nproc_per_node": 1}, {"torchherd_nodes": hosts}, hostvars)
    p["run_id"] = "r1"
    assert p["world_size"] == 6 and p["nproc_per_node"] is None
    verdict = gate(hosts, hostvars, p)
    assert verdict["ok"], verdict["problems"]
    assert verdict["nprocs"] == {"a": 1, "b": 2, "c": 3}
    assert verdict["world_size"] == 6 and verdict["nproc_per_node"] is None


def test_a_node_of_its_own_auto_takes_its_own_gpu_count():
    facts = {"a": gpu_facts("a", 8), "b": gpu_facts("b", 4)}
    hosts, hostvars, _p = make(facts)
    hostvars["b"]["torchherd_nproc_per_node"] = "auto"
    hostvars["a"]["torchherd_nproc_per_node"] = "auto"
    p = plan({"script": "train.py", "nproc_per_node": 2}, {"torchherd_nodes": hosts}, hostvars)
    p["run_id"] = "r1"
    verdict = gate(hosts, hostvars, p)
    assert verdict["ok"], verdict["problems"]
    assert verdict["nprocs"] == {"a": 8, "b": 4} and verdict["world_size"] == 12


def test_interfaces_are_recorded_and_a_node_without_one_is_named():
    a, b = cpu("a"), cpu("b")
    a["interface"] = {"name": "data0", "address": "10.0.0.1", "how": "local",
                      "master": "10.0.0.1", "error": None}
    b["interface"] = {"name": None, "address": None, "how": "route", "master": "10.0.0.1",
                      "error": "no route to 10.0.0.1 (Network is unreachable); routes: "
                               "10.9.0.0/24 dev eth0"}
    verdict = gate(*make({"a": a, "b": b}))
    assert checks(verdict) == [("b", "interface")]
    problem = verdict["problems"][0]
    assert "10.0.0.1" in problem["expected"] and "10.9.0.0/24 dev eth0" in problem["found"]
    assert verdict["interfaces"] == {"a": {"name": "data0", "address": "10.0.0.1",
                                           "how": "local"}}
    assert "data0 10.0.0.1" in verdict["table"]


def test_a_named_interface_missing_on_a_node_is_named():
    b = cpu("b")
    b["interface"] = {"name": None, "address": None, "how": "explicit", "master": "10.0.0.1",
                      "error": "no interface ib0 on this node (it has: eth0 10.0.0.2)"}
    hosts, hostvars, _p = make({"a": cpu("a"), "b": b})
    hostvars["b"]["torchherd_socket_ifname"] = "ib0"
    p = plan({"script": "train.py"}, {"torchherd_nodes": hosts}, hostvars)
    p["run_id"] = "r1"
    verdict = gate(hosts, hostvars, p)
    assert checks(verdict) == [("b", "interface")]
    assert "interface ib0" in verdict["problems"][0]["expected"]
    assert "torchherd_socket_ifname" in verdict["problems"][0]["fix"]


def test_cuda_and_nccl_versions_must_match():
    verdict = gate(*make({"a": gpu_facts("a", 2), "b": gpu_facts("b", 2, nccl="2.21.5")}))
    assert checks(verdict) == [("b", "same torch.nccl")]


def test_which_keys_must_match_is_configurable():
    facts = cpu("b")
    facts["python"]["version"] = "3.10.12"
    hosts, hv, p = make({"a": cpu("a"), "b": facts})
    assert gate(hosts, hv, p, match=["torch.version"])["ok"]


def test_gpu_counts_must_match_for_auto():
    verdict = gate(*make({"a": gpu_facts("a", 8), "b": gpu_facts("b", 4)}))
    assert ("b", "gpu count") in checks(verdict)


def test_nproc_above_gpu_count_with_nccl():
    verdict = gate(*make({"a": gpu_facts("a", 4), "b": gpu_facts("b", 4)}, nproc_per_node=8))
    assert checks(verdict) == [("a", "gpus"), ("b", "gpus")]
    assert verdict["problems"][0]["found"] == "4 GPUs"


def test_cpu_nodes_with_nccl_report_zero_gpus():
    verdict = gate(*make({"a": cpu("a"), "b": cpu("b")}, backend="nccl", nproc_per_node=2))
    assert checks(verdict) == [("a", "gpus"), ("a", "nccl"), ("b", "gpus"), ("b", "nccl")]


def test_gloo_on_gpu_nodes_may_oversubscribe():
    verdict = gate(*make({"a": gpu_facts("a", 1), "b": gpu_facts("b", 1)}, backend="gloo",
                         nproc_per_node=4))
    assert verdict["ok"], verdict["table"]


def test_duplicate_gpu_two_entries_for_one_machine():
    # Two inventory entries on one machine see the same GPUs: NCCL's "Duplicate GPU detected".
    verdict = gate(*make({"a": gpu_facts("box", 1), "b": gpu_facts("box", 1)}))
    assert ("a, b", "duplicate gpu") in checks(verdict)
    assert "CUDA_VISIBLE_DEVICES" in verdict["problems"][0]["fix"]


def test_distinct_gpus_on_one_machine_are_fine():
    a, b = gpu_facts("box", 1, uuid_prefix="x"), gpu_facts("box", 1, uuid_prefix="y")
    assert gate(*make({"a": a, "b": b}))["ok"]


def test_master_port_in_use_on_the_master_only():
    master, other = cpu("a"), cpu("b")
    master["port_free"] = False
    verdict = gate(*make({"a": master, "b": other}))
    assert checks(verdict) == [("a", "master port")]


def test_master_port_auto_is_the_port_the_master_picked():
    master, other = cpu("a"), cpu("b")
    master["port_picked"] = 41873
    verdict = gate(*make({"a": master, "b": other}, master_port="auto"))
    assert verdict["ok"] and verdict["master_port"] == 41873
    # A job's own port is the launch's as it stands.
    assert gate(*make({"a": cpu("a"), "b": cpu("b")}))["master_port"] == 29500


def test_master_port_auto_where_the_master_could_pick_none():
    master, other = cpu("a"), cpu("b")
    master["port_picked"] = None
    verdict = gate(*make({"a": master, "b": other}, master_port="auto"))
    assert checks(verdict) == [("a", "master port")] and verdict["master_port"] is None
    assert verdict["problems"][0]["found"] == "none could be bound"


def test_the_probe_names_the_port_the_master_picked():
    master = cpu("a")
    master["port_picked"] = 41873
    hosts, hv, p = make({"a": master, "b": cpu("b")}, master_port="auto")
    hv["b"]["torchherd_probe"] = {"reachable": False, "error": "timed out after 3 s"}
    verdict = gate(hosts, hv, p)
    assert "10.0.0.1:41873" in verdict["problems"][0]["expected"]


def test_probe_failure_names_the_pair():
    hosts, hv, p = make({"a": cpu("a"), "b": cpu("b"), "c": cpu("c")})
    hv["b"]["torchherd_probe"] = {"reachable": False, "error": "timed out after 3 s"}
    hv["a"]["torchherd_probe"] = {"reachable": True}
    hv["c"]["torchherd_probe"] = {"skipped": True}
    verdict = gate(hosts, hv, p)
    assert checks(verdict) == [("b -> a", "master reachable")]
    assert "10.0.0.1:29500" in verdict["problems"][0]["expected"]


def test_run_id_already_running():
    facts = cpu("b")
    facts["running_jobs"] = {"/root/.torchherd/runs/r1": [123, 124]}
    verdict = gate(*make({"a": cpu("a"), "b": facts}))
    assert checks(verdict) == [("b", "run id")]


def test_no_rsync_and_low_disk():
    facts = cpu("b")
    facts["rsync"] = None
    facts["disk_free_bytes"] = 100 << 20
    verdict = gate(*make({"a": cpu("a"), "b": facts}))
    assert checks(verdict) == [("b", "disk"), ("b", "rsync")]


def test_every_problem_has_the_five_parts():
    facts = cpu("b")
    facts["torch"]["version"] = "2.0.0"
    facts["rsync"] = None
    for problem in gate(*make({"a": cpu("a"), "b": facts}))["problems"]:
        assert all(problem[k] for k in ("host", "check", "expected", "found", "fix"))


def with_launchers(hostname, **versions):
    facts = cpu(hostname)
    facts["torch"]["launchers"] = {"accelerate": None, "deepspeed": None, **versions}
    return facts


def test_a_launcher_must_be_installed_on_every_node_in_the_same_version():
    nodes = {"a": with_launchers("a", accelerate="1.15.0"), "b": with_launchers("b"),
             "c": with_launchers("c", accelerate="1.14.0")}
    verdict = gate(*make(nodes, launcher="accelerate"))
    assert checks(verdict) == [("b", "accelerate"), ("c", "same torch.launchers.accelerate")]
    missing = next(p for p in verdict["problems"] if p["host"] == "b")
    assert missing["found"] == "not installed" and "pip install accelerate" in missing["fix"]
    # torchrun needs neither; facts of older nodes (no launchers) are fine for it.
    assert gate(*make(nodes))["ok"] and gate(*make({"a": cpu("a")}))["ok"]


def test_a_hang_watch_needs_py_spy_on_every_node():
    with_py_spy = dict(cpu("b"), py_spy="/usr/local/bin/py-spy")
    verdict = gate(*make({"a": cpu("a"), "b": with_py_spy}, hang_timeout=600))
    assert checks(verdict) == [("a", "py-spy")]
    assert "pip install py-spy" in verdict["problems"][0]["fix"]
    assert gate(*make({"a": cpu("a"), "b": cpu("b")}))["ok"]


def test_the_interconnect_verdict_joins_the_gate_with_every_nodes_result():
    hosts, hostvars, p = make({"a": cpu("a"), "b": cpu("b"), "c": cpu("c")},
                              interconnect_min_busbw=0.05)
    fast = {"busbw": 0.001, "algbw": 0.001, "latency_us": 900.0, "bytes": 8 << 20,
            "world_size": 3, "iterations": 2}
    pairs = {"a": [{"peer": 1, "gbps": 1.0}, {"peer": 2, "gbps": 0.002}],
             "b": [{"peer": 0, "gbps": 1.0}, {"peer": 2, "gbps": 0.002}],
             "c": [{"peer": 0, "gbps": 0.002}, {"peer": 1, "gbps": 0.002}]}
    for host in hosts:
        hostvars[host]["torchherd_interconnect"] = {"allreduce": fast, "pairs": pairs[host],
                                                    "error": None, "seconds": 3.0}
    verdict = gate(hosts, hostvars, p)
    assert checks(verdict) == [("c", "interconnect")]
    assert verdict["interconnect"]["slow_nodes"] == ["c"]
    assert verdict["interconnect"]["results"]["a"]["seconds"] == 3.0
    assert "interconnect: all-reduce bus bandwidth 0.001 GB/s" in verdict["table"]


# The checks one by one (gate runs them in order and lists their problems as they come).

def test_answered_separates_the_nodes_with_facts_from_those_that_gave_none():
    hostvars = {"a": {"torchherd_facts": cpu("a")},
                "b": {"ansible_host": "10.0.0.2", "torchherd_facts": {
                    "unreachable": True, "msg": "Host key verification failed."}},
                "c": {"torchherd_facts": {"failed": True, "msg": " no python \n"}}}
    facts, problems = answered(["a", "b", "c", "d"], hostvars)
    assert list(facts) == ["a"]
    assert [(p["host"], p["check"], p["found"]) for p in problems] == [
        ("b", "ssh host key", "an unknown or changed host key (Host key verification failed.)"),
        ("c", "facts", "no python"), ("d", "facts", "no facts")]
    assert "ssh-keyscan 10.0.0.2" in problems[0]["fix"]


def test_an_unknown_host_key_is_named_from_ssh_s_reason():
    """node_facts' action asks ssh again where Ansible lost its reason ("Data could not be
    sent"): the node's result then carries ssh's own words, and the gate names the host key."""
    hostvars = {
        "a": {"ansible_host": "10.0.0.2", "torchherd_facts": {
            "unreachable": True, "msg": "Failed to connect to the host via ssh: "
                                        "Host key verification failed."}},
        # ssh answered the second ask: the first failure stands as it was.
        "b": {"torchherd_facts": {
            "unreachable": True, "msg": "Data could not be sent to remote host '10.0.0.3'. "
            "Make sure this host can be reached over SSH: [Errno 32] Broken pipe"}}}
    _facts, problems = answered(["a", "b"], hostvars)
    assert [(p["host"], p["check"]) for p in problems] == [("a", "ssh host key"), ("b", "ssh")]
    assert problems[0]["found"] == ("an unknown or changed host key "
                                    "(ssh: Host key verification failed.)")
    assert "ssh-keyscan 10.0.0.2" in problems[0]["fix"]
    assert "Broken pipe" in problems[1]["found"]


# node_facts' results where the node's Python for Ansible is missing or broken, as Ansible
# 2.19 registered them (a local node with ansible_python_interpreter set).
INTERPRETER_MISSING = {
    "changed": False, "failed": True, "exception": "(traceback unavailable)", "rc": 127,
    "module_stderr": "/bin/sh: 1: /nonexistent/python: not found\n", "module_stdout": "",
    "msg": "The module interpreter '/nonexistent/python' was not found."}
INTERPRETER_BROKEN = {
    "changed": False, "failed": True, "exception": "(traceback unavailable)", "rc": 1,
    "module_stderr": "Fatal Python error: init_fs_encoding: failed to get the Python codec of "
                     "the filesystem encoding\n", "module_stdout": "",
    "msg": "Module result deserialization failed: No start of json char found"}


def test_a_missing_or_broken_module_python_names_the_interpreter_and_the_inventory():
    hostvars = {
        "a": {"torchherd_facts": INTERPRETER_MISSING, "inventory_file": "/c/nodes.ini",
              "ansible_python_interpreter": "/nonexistent/python"},
        "b": {"torchherd_facts": INTERPRETER_BROKEN, "inventory_file": "/c/nodes.ini",
              "ansible_python_interpreter": "/opt/py/bin/python3"},
        # No interpreter in the inventory: the one Ansible discovered.
        "c": {"torchherd_facts": dict(INTERPRETER_BROKEN),
              "ansible_facts": {"discovered_interpreter_python": "/usr/bin/python3"}},
        # The module's own crash (its Python ran it): not the interpreter's fault.
        "d": {"torchherd_facts": dict(INTERPRETER_BROKEN, module_stderr=(
            "Traceback (most recent call last):\n  ...\nKeyError: 'x'\n"))}}
    _facts, problems = answered(["a", "b", "c", "d"], hostvars)
    assert [(p["host"], p["check"]) for p in problems] == [
        ("a", "ansible python"), ("b", "ansible python"), ("c", "ansible python"), ("d", "facts")]
    a, b, c, _d = problems
    assert a["found"] == "/nonexistent/python: /bin/sh: 1: /nonexistent/python: not found"
    assert a["expected"] == "a Python 3 at /nonexistent/python that runs Ansible's modules"
    assert a["fix"].startswith("set ansible_python_interpreter for a in /c/nodes.ini to")
    assert "install python3" in a["fix"]
    assert b["found"].startswith("/opt/py/bin/python3: Fatal Python error: init_fs_encoding")
    assert "deserialization" not in b["found"]
    assert c["found"].startswith("/usr/bin/python3: Fatal Python error")
    assert "for c in <inventory>" in c["fix"]

def test_node_checks_of_a_healthy_node_find_nothing():
    _hosts, _hv, p = make({"a": cpu("a")}, hang_timeout=600)
    facts = dict(cpu("a"), py_spy="/usr/bin/py-spy")
    assert [check("a", facts, p) for check in NODE_CHECKS] == [[]] * len(NODE_CHECKS)


def test_node_checks_one_by_one():
    _hosts, _hv, p = make({"a": cpu("a")}, hang_timeout=600)
    facts = dict(cpu("a"), rsync=None, disk_free_bytes=1, root="/x",
                 running_jobs={"/x/runs/r1": [7], "/x/runs/r10": [8], "/y/runs/r1": [9]})
    facts["python"] = {"path": "/v/python", "version": None, "error": "not found"}
    assert interpreter("a", facts, p)[0]["check"] == "python"
    assert rsync("a", facts, p)[0]["found"] == "not found"
    assert "/v/python -m pip install py-spy" in py_spy("a", facts, p)[0]["fix"]
    assert disk("a", facts, p)[0]["found"] == "0.0 GiB"
    assert [x["found"] for x in run_id_free("a", facts, p)] == ["running as pids [7]"]


def test_launcher_installed_and_its_version_compared_only_for_a_launcher_of_its_own():
    nodes = {"a": with_launchers("a", deepspeed="0.17.0"), "b": with_launchers("b")}
    assert launcher_installed(nodes, LAUNCHERS["torchrun"]) == []
    problem, = launcher_installed(nodes, LAUNCHERS["deepspeed"])
    assert (problem["host"], problem["check"]) == ("b", "deepspeed")
    assert "pip install deepspeed with /usr/bin/python3" in problem["fix"]
    assert _match_keys(None, LAUNCHERS["torchrun"]) == DEFAULT_MATCH
    assert _match_keys(["torch.version"], LAUNCHERS["deepspeed"]) == [
        "torch.version", "torch.launchers.deepspeed"]


def test_versions_match_the_first_usable_node_without_the_master():
    old = cpu("c")
    old["torch"]["version"] = "2.0.0"
    problem, = versions_match({"b": cpu("b"), "c": old}, "a", ["torch.version"])
    assert (problem["host"], problem["expected"]) == ("c", "2.13.0+cpu (as on b)")
    assert versions_match({}, "a", ["torch.version"]) == []


def test_a_node_the_master_cannot_reach_back_and_its_rules_without_root():
    hosts, hostvars, p = make({"a": cpu("a"), "b": cpu("b")}, firewall_mode="ports",
                              firewall_ports=["50000-50999"])
    hostvars["a"]["torchherd_start"] = {"probe": {"reachable": True,
                                                  "back_failed": {"10.0.0.2": "refused"}}}
    hostvars["b"]["torchherd_probe"] = {"reachable": True, "address": "10.0.0.2",
                                        "back_error": "timed out"}
    hostvars["b"]["torchherd_firewall"] = {"no_privilege": True, "msg": "sudo: a password"}
    problem, = reachable({"a": cpu("a"), "b": cpu("b")}, hostvars, p)
    assert (problem["host"], problem["check"]) == ("a -> b", "reachable from the master")
    assert problem["found"] == "refused (timed out)"
    rules, = firewall_without_root(hosts, hostvars, p)
    assert rules["host"] == "b" and "TCP ports 50000-50999 from 10.0.0.1" in rules["expected"]
    assert "tcp dport { 50000-50999 }" in rules["fix"]
    verdict = gate(hosts, hostvars, p)
    assert checks(verdict) == [("a -> b", "reachable from the master"),
                               ("b", "firewall (no root)")]
    # Where every path opened, no node is asked for rules.
    del hostvars["b"]["torchherd_probe"], hostvars["a"]["torchherd_start"]
    assert gate(hosts, hostvars, p)["ok"]


def test_process_counts_and_backend_resolved():
    _hosts, _hv, p = make({"a": cpu("a"), "b": cpu("b")})
    assert same_gpu_count({"a": 8, "b": 8}) == []
    assert [x["host"] for x in same_gpu_count({"a": 8, "b": 4})] == ["a", "b"]
    # The job's auto everywhere: the smallest GPU count on every node (1 without GPUs).
    assert _nprocs(["a", "b"], p, {"a": 8, "b": 4}, auto=True) == {"a": 4, "b": 4}
    assert _nprocs(["a", "b"], p, {"a": 8, "b": 4}, auto=False) == {"a": 8, "b": 4}
    assert _nprocs(["a", "b"], p, {}, auto=True) == {"a": 1, "b": 1}
    assert _backend({"backend": "auto"}, {"a": 1, "b": 0}) == "gloo"
    assert _backend({"backend": "auto"}, {"a": 1, "b": 2}) == "nccl"
    assert _backend({"backend": "gloo"}, {"a": 1}) == "gloo"


def test_backend_available_and_duplicate_gpus_by_backend():
    box = {"a": gpu_facts("box", 1), "b": gpu_facts("box", 1)}
    assert backend_available(box, "nccl", {"a": 1, "b": 1}, {"a": 1, "b": 1}) == []
    assert [x["check"] for x in backend_available(box, "nccl", {"a": 1, "b": 1},
                                                  {"a": 2, "b": 1})] == ["gpus"]
    assert [x["host"] for x in duplicate_gpus(box, "nccl")] == ["a, b"]
    # gloo does not mind two processes on one GPU.
    assert duplicate_gpus(box, "gloo") == []


def test_a_venv_that_could_not_be_made_is_the_nodes_problem_not_its_python(tmp_path):
    (tmp_path / "req.lock").write_text("thpin==9.9\n")
    hosts, hostvars, p = make({"a": cpu("a"), "b": cpu("b")}, code_src=str(tmp_path),
                              venv={"lock": "req.lock"})
    broken = hostvars["b"]["torchherd_facts"]
    broken["venv"] = {"path": "/root/.torchherd/venvs/k", "made": False,
                      "error": "uv pip sync exited with 1: No solution found: thpin==9.9"}
    broken["python"] = {"path": "/root/.torchherd/venvs/k/bin/python", "version": None,
                        "error": "interpreter not found"}
    broken["torch"] = {"version": None, "error": "interpreter not found"}
    verdict = gate(hosts, hostvars, p)
    assert checks(verdict) == [("b", "venv")]
    problem = verdict["problems"][0]
    assert "req.lock" in problem["expected"] and "thpin==9.9" in problem["found"]
    assert "find_links" in problem["fix"]
