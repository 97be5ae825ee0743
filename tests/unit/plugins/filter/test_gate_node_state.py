"""The preflight checks of the GPUs a job uses and of what NCCL needs from a node, on node state
in the formats nvidia-smi, /dev/kmsg and /sys print (fixtures/node_state, see its README), read
by the node-side parsers node_facts uses; each check both passing and flagging."""

import copy
from pathlib import Path

import pytest
from test_gate import gpu_facts, make

from ansible_collections.torchherd.cluster.plugins.filter.gate import gate
from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import (
    parse_apps,
    parse_smi,
    xid_lines,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import (
    infiniband,
    shm_bytes,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.gpus import arch_support

STATE = Path(__file__).resolve().parent / "fixtures" / "node_state"
H100_ARCH = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


def node(hostname, smi="smi_query_gpu_8xh100.csv", **extra):
    """The facts of a node whose GPUs are those of the recorded query (healthy host otherwise)."""
    gpus, driver = parse_smi((STATE / smi).read_text())
    facts = gpu_facts(hostname, len(gpus))
    facts["torch"].update(gpus=gpus, driver=driver, arch_list=H100_ARCH, cuda="12.8",
                          version="2.9.0+cu128")
    facts.update(boot_id=f"boot-{hostname}", shm_bytes=16 << 30, memlock="unlimited",
                 infiniband={}, xid=[], gpu_processes=[])
    facts.update(extra)
    return facts


def found(verdict, kind="problems"):
    return sorted((p["host"], p["check"]) for p in verdict[kind])


def test_the_healthy_gpus_pass_every_check():
    # The first H100 of the one node and the L4 of the other: nothing to say of either.
    verdict = gate(*make({"a": node("a"), "b": node("b", "smi_query_gpu_l4.csv")},
                         backend="nccl", nproc_per_node=1))
    assert verdict["ok"], verdict["table"]
    assert verdict["problems"] == [] and verdict["warnings"] == []


def test_each_sick_gpu_is_named_by_its_check():
    verdict = gate(*make({"a": node("a")}, backend="nccl", nproc_per_node=8))
    assert found(verdict) == [("a", "gpu compute mode")]  # GPU 3, Prohibited: refused
    assert "GPU 3 (GPU-c0ffee00" in verdict["problems"][0]["expected"]
    assert found(verdict, "warnings") == [
        ("a", "gpu compute mode"), ("a", "gpu memory"), ("a", "mig"), ("a", "persistence mode")]
    by_check = {w["check"]: w for w in verdict["warnings"]}
    assert "GPU 1 " in by_check["persistence mode"]["found"]
    assert by_check["gpu memory"]["found"] == ("2 uncorrected ECC errors since the driver "
                                               "loaded, remapped rows pending")
    assert "Exclusive_Process" in by_check["gpu compute mode"]["found"]
    # The warnings are shown with the table and do not fail the launch on their own.
    assert "4 warning(s), the job may start" in verdict["table"]


def test_a_gpu_held_by_another_process_refuses_naming_it():
    apps = parse_apps((STATE / "smi_compute_apps.csv").read_text())
    assert apps[1] == {"gpu_uuid": "4f1e7a52-9c0b-4d1e-8a3f-0c6b5d2e1a90", "pid": 31400,
                       "used_memory_bytes": None, "name": "python3, with a comma"}
    verdict = gate(*make({"a": node("a", gpu_processes=apps)}, backend="nccl",
                         nproc_per_node=1))
    assert found(verdict) == [("a", "gpu busy")]
    problem = verdict["problems"][0]
    assert problem["found"] == ("held by pid 31337 (/home/other/venv/bin/python, 20480 MiB), "
                                "pid 31400 (python3, with a comma)")
    # This run's own processes (a relaunch's leftovers have their own check) are not others'.
    mine = node("a", gpu_processes=apps,
                running_jobs={"/root/.torchherd/runs/r1": [31337, 31400]})
    assert found(gate(*make({"a": mine}, backend="nccl", nproc_per_node=1))) == [("a", "run id")]


def test_a_busy_gpu_the_job_does_not_use_passes_and_preflight_warn_downgrades():
    apps = parse_apps((STATE / "smi_compute_apps.csv").read_text())
    facts = node("a", gpu_processes=[dict(a, gpu_uuid="0badcafe-0000-4111-8222-333344445555")
                                     for a in apps])  # GPU 7
    assert gate(*make({"a": facts}, backend="nccl", nproc_per_node=1))["ok"]
    verdict = gate(*make({"a": facts}, backend="nccl", nproc_per_node=8,
                         preflight_warn=["gpu busy", "gpu compute mode"]))
    assert verdict["ok"], verdict["table"]
    assert ("a", "gpu busy") in found(verdict, "warnings")


@pytest.mark.parametrize(("cap", "arch", "how"), [
    ("9.0", H100_ARCH, "sass"),
    ("8.9", ["sm_80", "sm_86", "sm_90"], "sass"),      # sm_86 kernels run on 8.9
    ("9.0", ["sm_80", "sm_90a"], "sass"),               # arch-specific, exactly 9.0
    ("10.0", ["sm_80", "sm_90a", "compute_90a"], None),  # 'a' features exist on 9.0 only
    ("10.0", ["sm_80", "sm_90", "compute_90"], "ptx"),  # JIT from PTX of an older arch
    ("12.0", ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], None),
    ("8.0", ["sm_86", "sm_90"], None),                  # no kernel of a newer minor runs
])
def test_arch_support_as_cuda_loads_kernels(cap, arch, how):
    assert arch_support(cap, arch) == how


def test_a_gpu_the_build_has_no_kernels_for_refuses_and_ptx_only_warns():
    l4 = node("a", "smi_query_gpu_l4.csv")
    assert gate(*make({"a": l4}, backend="nccl"))["ok"]
    l4["torch"]["arch_list"] = ["sm_90", "sm_100"]
    verdict = gate(*make({"a": l4}, backend="nccl"))
    assert found(verdict) == [("a", "gpu arch")]
    assert verdict["problems"][0]["expected"].startswith("sm_89 ")
    l4["torch"]["arch_list"] = ["sm_70", "compute_70"]
    verdict = gate(*make({"a": l4}, backend="nccl"))
    assert verdict["ok"] and found(verdict, "warnings") == [("a", "gpu arch")]


@pytest.mark.parametrize(("cuda", "driver", "ok"), [
    ("12.8", "570.124.06", True), ("12.8", "525.60.13", True), ("12.1", "520.61.05", False),
    ("13.0", "575.57.08", False), ("13.0", "580.65.06", True), ("11.8", "450.80.02", True),
    ("11.8", "418.87.01", False)])
def test_the_driver_must_be_new_enough_for_torchs_cuda(cuda, driver, ok):
    facts = node("a", "smi_query_gpu_l4.csv")
    facts["torch"].update(cuda=cuda, driver=driver)
    verdict = gate(*make({"a": facts}, backend="nccl"))
    assert found(verdict) == ([] if ok else [("a", "cuda driver")])


def test_two_entries_for_one_machine_collide_and_containers_with_own_names_pass():
    one = node("n")
    twin = node("n", boot_id=one["boot_id"])
    twin["torch"]["gpus"] = copy.deepcopy(node("m", "smi_query_gpu_l4.csv")["torch"]["gpus"])
    verdict = gate(*make({"a": one, "b": twin}, backend="nccl", nproc_per_node=1))
    assert found(verdict) == [("a, b", "host identity")]
    assert "host name n and boot id boot-n" in verdict["problems"][0]["found"]
    # The container testbed: one kernel (one boot id), a host name each.
    pods = {h: node(h, "smi_query_gpu_l4.csv", boot_id="shared") for h in ("a", "b")}
    pods["b"]["torch"]["gpus"] = [dict(pods["b"]["torch"]["gpus"][0], uuid="other")]
    assert gate(*make(pods, backend="nccl", nproc_per_node=1))["ok"]
    # gloo does not care which machine is which (the local inventory's nodes share one).
    assert gate(*make({"a": one, "b": twin}, backend="gloo", nproc_per_node=1))["ok"]


def test_a_job_wide_nccl_hostid_collides():
    pods = {h: node(h, "smi_query_gpu_l4.csv") for h in ("a", "b")}
    pods["b"]["torch"]["gpus"] = [dict(pods["b"]["torch"]["gpus"][0], uuid="other")]
    verdict = gate(*make(pods, backend="nccl", nproc_per_node=1, env={"NCCL_HOSTID": "x"}))
    assert found(verdict) == [("a, b", "host identity")]


def test_rdma_ports_the_job_uses_must_be_up():
    ib = infiniband(str(STATE / "infiniband"))
    assert ib == {"mlx5_0": {"1": {"state": "ACTIVE", "link_layer": "InfiniBand"}},
                  "mlx5_1": {"1": {"state": "DOWN", "link_layer": "Ethernet"}}}

    def verdict(env, ports=ib, limit="unlimited", alone=False):
        facts = node("a", "smi_query_gpu_l4.csv", infiniband=ports, memlock=limit)
        # Node b (another L4, no RDMA devices): NCCL between a and b goes over a's ports.
        other = node("b", "smi_query_gpu_l4.csv")
        other["torch"]["gpus"] = [dict(g, uuid="b-" + g["uuid"]) for g in other["torch"]["gpus"]]
        nodes = {"a": facts} if alone else {"a": facts, "b": other}
        return gate(*make(nodes, backend="nccl", env=env))

    assert verdict({})["ok"]  # NCCL takes the active port
    assert verdict({"NCCL_IB_HCA": "mlx5_0:1"})["ok"]
    assert verdict({"NCCL_IB_HCA": "^mlx5_1"})["ok"]
    down = verdict({"NCCL_IB_HCA": "=mlx5_0,mlx5_1"})
    assert found(down) == [("a", "rdma port")] and down["problems"][0]["found"] == "mlx5_1:1 DOWN"
    none = verdict({"NCCL_IB_HCA": "mlx6"})
    assert none["problems"][0]["found"].startswith("it selects none of mlx5_0:1 ACTIVE")
    all_down = {d: {"1": dict(p["1"], state="DOWN")} for d, p in ib.items()}
    assert found(verdict({}, all_down)) == [("a", "rdma port")]
    assert verdict({"NCCL_IB_DISABLE": "1"}, all_down)["ok"]
    # A locked-memory limit RDMA cannot register its buffers with: a warning.
    small = verdict({}, limit=8 << 20)
    assert small["ok"] and small["warnings"][0]["check"] == "memlock"
    assert small["warnings"][0]["found"] == "8 MiB"
    assert verdict({"NCCL_IB_DISABLE": "1"}, limit=8 << 20)["warnings"] == []
    # A job on one node never leaves it (shared memory, P2P): its ports do not matter.
    alone = verdict({}, all_down, limit=8 << 20, alone=True)
    assert alone["ok"] and alone["warnings"] == []


def test_the_start_names_exactly_the_active_rdma_ports():
    ib = infiniband(str(STATE / "infiniband"))  # mlx5_0 port 1 ACTIVE, mlx5_1 port 1 DOWN

    def node_env(env, ports=ib, backend="nccl", alone=False):
        facts = node("a", "smi_query_gpu_l4.csv", infiniband=ports)
        other = node("b", "smi_query_gpu_l4.csv")
        other["torch"]["gpus"] = [dict(g, uuid="b-" + g["uuid"]) for g in other["torch"]["gpus"]]
        nodes = {"a": facts} if alone else {"a": facts, "b": other}
        return gate(*make(nodes, backend=backend, env=env))["node_env"]

    assert node_env({}) == {"a": {"NCCL_IB_HCA": "=mlx5_0:1"}}  # b has no RDMA device
    two = {**ib, "mlx5_1": {"1": dict(ib["mlx5_1"]["1"], state="ACTIVE")}}
    assert node_env({}, two)["a"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    # The job's own choice, NCCL's IB off, one node (never on the network), gloo: nothing.
    assert node_env({"NCCL_IB_HCA": "mlx5_1"}) == {}
    assert node_env({"NCCL_IB_DISABLE": "1"}) == {}
    assert node_env({}, alone=True) == {}
    assert node_env({}, backend="gloo") == {}
    all_down = {d: {"1": dict(p["1"], state="DOWN")} for d, p in ib.items()}
    assert node_env({"NCCL_IB_DISABLE": "1"}, all_down) == {}


def test_xid_history_warns_and_an_unreadable_log_says_nothing():
    xids = xid_lines((STATE / "kmsg_xid.txt").read_text().splitlines())
    assert len(xids) == 2 and xids[0].startswith("NVRM: Xid (PCI:0000:18:00): 48,")
    verdict = gate(*make({"a": node("a", "smi_query_gpu_l4.csv", xid=xids)}, backend="nccl"))
    assert verdict["ok"] and found(verdict, "warnings") == [("a", "xid")]
    assert verdict["warnings"][0]["found"].startswith("2, the last: NVRM: Xid (PCI:0000:18:00): 63")
    for unread in (None, []):
        verdict = gate(*make({"a": node("a", "smi_query_gpu_l4.csv", xid=unread)},
                             backend="nccl"))
        assert verdict["warnings"] == []


def test_a_small_dev_shm_warns_with_more_than_one_process(tmp_path):
    assert shm_bytes(str(tmp_path)) > 0 and shm_bytes(str(tmp_path / "none")) is None
    facts = node("a", shm_bytes=64 << 20)
    verdict = gate(*make({"a": facts}, backend="nccl", nproc_per_node=2))
    assert verdict["ok"] and found(verdict, "warnings") == [("a", "persistence mode"),
                                                           ("a", "shm")]
    shm = next(w for w in verdict["warnings"] if w["check"] == "shm")
    assert shm["found"] == "64 MiB" and "--shm-size" in shm["fix"]
    assert gate(*make({"a": facts}, backend="nccl", nproc_per_node=1))["warnings"] == []


def test_the_job_spec_offers_exactly_the_refusals_that_may_warn():
    """preflight_warn's choices (the job spec) and the gate's DOWNGRADABLE are one list."""
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate import DOWNGRADABLE
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import job_spec

    job_keys = job_spec()["torchherd_job"]["options"]
    assert sorted(job_keys["preflight_warn"]["choices"]) == sorted(DOWNGRADABLE)


def test_the_start_names_the_active_nics_nearest_to_the_jobs_gpus(tmp_path):
    from sysfs_tree import make_sys

    from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import gpu_nics

    smi = "smi_query_gpu_4xh100_bus.csv"
    gpus, _driver = parse_smi((STATE / smi).read_text())

    def hca(nproc, states=None, name="t"):
        ib_dir, pci_dir = make_sys(tmp_path / name, states=states)
        extra = {"infiniband": infiniband(ib_dir), "gpu_nics": gpu_nics(gpus, ib_dir, pci_dir)}
        nodes = {"a": node("a", smi, **extra), "b": node("b", smi, **extra)}
        nodes["b"]["torch"]["gpus"] = [dict(g, uuid="b-" + g["uuid"])
                                       for g in nodes["b"]["torch"]["gpus"]]
        verdict = gate(*make(nodes, backend="nccl", nproc_per_node=nproc))
        return verdict["node_env"]["a"]["NCCL_IB_HCA"], verdict["node_env"]["b"]["NCCL_IB_HCA"]

    # All four GPUs: the NIC beside each, not the storage NIC nor the one two switches down.
    # Node b's GPUs are not placed (other UUIDs): every active port, as without the tree.
    assert hca(4) == ("=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
                      "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1")
    assert hca(1, name="one")[0] == "=mlx5_0:1"
    # GPU 0's own NIC down: the nearest that is up.
    assert hca(1, {"mlx5_0": "1: DOWN"}, name="down")[0] == "=mlx5_4:1"
