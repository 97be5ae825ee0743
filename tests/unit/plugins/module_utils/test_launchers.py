"""The launcher registry: every launcher holds the whole interface, and the lists of launcher
names kept elsewhere (YAML choices) stay equal to it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from ansible_collections.torchherd.cluster.plugins.doc_fragments import _torchrun_job
from ansible_collections.torchherd.cluster.plugins.module_utils import _torchprobe
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import (
    LAUNCHERS,
    distributions,
    packages,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import job_spec

STATIC = {"rdzv": "static"}


def test_the_plan_roles_choices_are_the_registrys_names_in_its_order():
    job = job_spec()["torchherd_job"]["options"]
    assert job["launcher"]["choices"] == list(LAUNCHERS)
    assert job["launcher"]["default"] == "torchrun"


def test_the_torchrun_job_modules_choices_are_the_registrys_names():
    options = yaml.safe_load(_torchrun_job.ModuleDocFragment.DOCUMENTATION)["options"]
    assert options["launcher"]["choices"] == list(LAUNCHERS)


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_every_launcher_holds_the_whole_interface(name):
    launcher = LAUNCHERS[name]
    assert name == launcher.NAME
    # A distribution of its own comes with the fix for nodes that have other versions of it.
    assert (launcher.DISTRIBUTION is None) == (launcher.FIX is None)
    assert launcher.PLANNED_OPTIONS and all(o.startswith("-") for o in launcher.PLANNED_OPTIONS)
    assert all(callable(getattr(launcher, f)) for f in ("argv", "env", "constraints"))


def test_distributions_leave_out_torchrun_which_comes_with_torch():
    assert distributions() == {"accelerate": "accelerate", "deepspeed": "deepspeed"}
    assert packages() == {"accelerate": "accelerate", "deepspeed": "deepspeed"}


def test_only_torchrun_takes_an_elastic_rendezvous():
    assert LAUNCHERS["torchrun"].constraints({"rdzv": "c10d"}, {"a": 1}) == []
    for name in ("accelerate", "deepspeed"):
        assert LAUNCHERS[name].constraints(STATIC, {"a": 1}) == []
        problem, = LAUNCHERS[name].constraints({"rdzv": "c10d"}, {"a": 1})
        assert problem.startswith(f"job.rdzv: expected static with launcher {name}")


def test_accelerate_alone_needs_one_process_count_on_every_node():
    counts = {"a": 1, "b": 2, "c": None}  # None: an invalid count, the plan's own problem
    problem, = LAUNCHERS["accelerate"].constraints(STATIC, counts)
    assert "found a=1, b=2, c=None;" in problem
    assert LAUNCHERS["accelerate"].constraints(STATIC, {"a": 2, "b": 2, "c": None}) == []
    assert LAUNCHERS["deepspeed"].constraints(STATIC, counts) == []
    assert LAUNCHERS["torchrun"].constraints(STATIC, counts) == []


def test_only_accelerate_needs_an_environment_of_its_own_and_only_on_cpu():
    assert LAUNCHERS["accelerate"].env({"use_cpu": True}) == {"ACCELERATE_USE_CPU": "1"}
    assert LAUNCHERS["accelerate"].env({"use_cpu": False}) == {}
    assert all(LAUNCHERS[n].env({"use_cpu": True}) == {} for n in ("torchrun", "deepspeed"))


def test_node_facts_reads_the_version_of_every_launchers_distribution():
    """The code that runs in the job's interpreter reads the registry's distributions by their
    launcher's name; a distribution that is installed gives its version."""
    scope = {}
    exec(compile(_torchprobe.LAUNCHER_VERSIONS, "<launcher_versions>", "exec"), scope)
    assert set(scope["launcher_versions"]()) == set(distributions())
    scope["DISTRIBUTIONS"] = {"somelauncher": "pytest"}
    assert scope["launcher_versions"]() == {"somelauncher": pytest.__version__}
    assert _torchprobe.TORCH_PROBE.startswith(_torchprobe.LAUNCHER_VERSIONS)
    assert _torchprobe.FINGERPRINT.startswith(_torchprobe.LAUNCHER_VERSIONS)


def test_a_launcher_that_is_not_importable_costs_no_metadata_scan():
    """Its package not found: version None, and importlib.metadata (a tenth of a second to
    import, on every launch's fingerprint) is never imported. -S: no site, which may import it."""
    code = (_torchprobe.LAUNCHER_VERSIONS
            + "\nDISTRIBUTIONS = {'gone': 'no-such-distribution-here'}\nPACKAGES = {}\n"
              "import json, sys\nprint(json.dumps([launcher_versions(), "
              "'importlib.metadata' in sys.modules]))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [{"gone": None}, False]


ACCELERATE = {"nnodes": "2", "nproc_per_node": 2, "node_rank": 1, "master_addr": "10.0.0.1",
              "master_port": 29500, "max_restarts": 0}


def test_accelerate_on_two_nodes_of_two_processes_is_one_multi_process_world():
    argv = LAUNCHERS["accelerate"].argv(ACCELERATE, {"torchrun_logs": "/r/logs"}, "/v/python")
    assert argv == ["/v/python", "-m", "accelerate.commands.launch", "--multi_gpu",
                    "--same_network", "--num_machines", "2", "--machine_rank", "1",
                    "--num_processes", "4", "--main_process_ip", "10.0.0.1",
                    "--main_process_port", "29500", "--max_restarts", "0",
                    "--log_dir", "/r/logs", "--tee", "3"]


def test_accelerate_with_one_process_in_all_leaves_out_the_multi_process_flags():
    # accelerate refuses --multi_gpu below 2 processes; one machine has no rank or master.
    one = dict(ACCELERATE, nnodes="1", nproc_per_node=1, node_rank=0)
    argv = LAUNCHERS["accelerate"].argv(one, {"torchrun_logs": "/r/logs"}, "/v/python")
    assert argv == ["/v/python", "-m", "accelerate.commands.launch", "--num_machines", "1",
                    "--num_processes", "1", "--main_process_port", "29500",
                    "--max_restarts", "0", "--log_dir", "/r/logs", "--tee", "3"]
    # One node of two processes is still accelerate's multi-process mode.
    two = LAUNCHERS["accelerate"].argv(dict(one, nproc_per_node=2), {"torchrun_logs": "/l"}, "p")
    assert "--multi_gpu" in two and two[two.index("--num_processes") + 1] == "2"


def test_who_writes_per_rank_log_files():
    """Where the supervisor looks for the job's first output."""
    one = {"nnodes": "1", "nproc_per_node": 1}
    two = {"nnodes": "2", "nproc_per_node": 1}
    assert LAUNCHERS["torchrun"].rank_logs(one) and LAUNCHERS["torchrun"].rank_logs(two)
    assert not LAUNCHERS["accelerate"].rank_logs(one) and LAUNCHERS["accelerate"].rank_logs(two)
    assert not LAUNCHERS["deepspeed"].rank_logs(two)
