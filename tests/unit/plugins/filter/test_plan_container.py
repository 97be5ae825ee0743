"""The job's container image in the plan (each node's interpreter is the image's unless the node
or the job names one; what cannot go with an image is refused before any node is touched), and
the gate's container check naming the node with what it found and how to fix it."""

import copy

import pytest
from ansible.errors import AnsibleFilterError
from test_gate import CPU, make

from ansible_collections.torchherd.cluster.plugins.filter.gate import gate
from ansible_collections.torchherd.cluster.plugins.filter.plan import plan

GROUPS = {"torchherd_nodes": ["a", "b"]}


def node_facts(hostname, **extra):
    return {**copy.deepcopy(CPU), "hostname": hostname, **extra}
HOSTVARS = {"a": {"ansible_host": "10.0.0.1", "ansible_python_interpreter": "/usr/bin/python3"},
            "b": {"ansible_host": "10.0.0.2", "torchherd_python": "/opt/conda/bin/python"}}


def test_the_nodes_run_the_images_python_unless_a_node_names_its_own():
    p = plan({"script": "train.py", "container": {"image": "nvcr.io/nvidia/pytorch:25.01-py3",
                                                  "pull": "never"}}, GROUPS, HOSTVARS)
    assert p["container"] == {"image": "nvcr.io/nvidia/pytorch:25.01-py3", "runtime": "auto",
                              "pull": "never", "python": "python3"}
    assert [n["python"] for n in p["nodes"]] == ["python3", "/opt/conda/bin/python"]
    # Without an image: the node's own interpreter, as always.
    assert plan({"script": "train.py"}, GROUPS, HOSTVARS)["container"] is None


@pytest.mark.parametrize("job,words", [
    ({"container": {"image": "img:1"}, "venv": {"lock": "req.lock"}},
     "job.container and job.venv: expected one of them"),
    ({"container": {"image": "img:1"}, "spawn": "srun"}, "job.container with spawn srun"),
    ({"container": {"pull": "always"}}, "job.container: expected an image with pull"),
])
def test_what_cannot_go_with_an_image_is_refused_on_the_controller(tmp_path, job, words):
    (tmp_path / "req.lock").write_text("numpy==2.4.6\n")
    with pytest.raises(AnsibleFilterError, match=words):
        plan({"script": "train.py", "code_src": str(tmp_path), **job}, GROUPS, HOSTVARS)


def test_the_gate_names_the_node_whose_image_cannot_run_and_stays_quiet_on_its_python():
    found = {"runtime": "podman", "path": "/usr/bin/podman", "image": "img:1", "id": None,
             "pulled": False, "seconds": 0.1,
             "error": "image img:1 is not on this node and the job's pull policy is never"}
    sick = node_facts("b", container=found, python={"path": "python3", "version": None,
                                                    "error": None},
                      torch={"version": None, "error": None})
    verdict = gate(*make({"a": node_facts("a"), "b": sick}, container={"image": "img:1"}))
    assert [(p["host"], p["check"]) for p in verdict["problems"]] == [("b", "container")]
    problem = verdict["problems"][0]
    assert problem["expected"] == "image img:1 runnable with podman"
    assert "podman pull img:1" in problem["fix"] and "container.pull" in problem["fix"]
    missing = dict(found, runtime=None, path=None,
                   error="no container runtime: expected podman or docker on PATH, found none")
    verdict = gate(*make({"a": node_facts("a"), "b": dict(sick, container=missing)},
                         container={"image": "img:1"}))
    assert "install podman, docker or apptainer" in verdict["problems"][0]["fix"]


def test_an_apptainer_image_missing_on_a_node_is_named_with_its_own_fix():
    sif = "/shared/images/train.sif"
    found = {"runtime": "apptainer", "path": "/usr/bin/apptainer", "image": sif, "id": None,
             "pulled": False, "seconds": 0.0,
             "error": f"image {sif} is not on this node (apptainer runs a SIF file or sandbox "
                      "directory there, or pulls one given as a docker://, oras:// or "
                      "library:// URI)"}
    sick = node_facts("b", container=found, python={"path": "python3", "version": None,
                                                    "error": None},
                      torch={"version": None, "error": None})
    verdict = gate(*make({"a": node_facts("a"), "b": sick},
                         container={"image": sif, "runtime": "apptainer"}))
    assert [(p["host"], p["check"]) for p in verdict["problems"]] == [("b", "container")]
    problem = verdict["problems"][0]
    assert problem["expected"] == f"image {sif} runnable with apptainer"
    assert f"copy the SIF file to {sif} on the node" in problem["fix"]
    never = dict(found, image="docker://x/train:1",
                 error="image docker://x/train:1 is not on this node and the job's pull policy "
                       "is never")
    verdict = gate(*make({"a": node_facts("a"), "b": dict(sick, container=never)},
                         container={"image": "docker://x/train:1", "runtime": "apptainer"}))
    assert verdict["problems"][0]["fix"].startswith("set container.pull to missing")
    p = plan({"script": "train.py", "container": {"image": "docker://x/train:1",
                                                  "runtime": "apptainer"}}, GROUPS, HOSTVARS)
    assert p["container"]["runtime"] == "apptainer"


def test_an_image_whose_python_does_not_run_says_so_in_the_images_words():
    image = {"runtime": "podman", "path": "/usr/bin/podman", "image": "img:1", "id": "5eb7",
             "pulled": False, "seconds": 0.1, "error": None}
    broken = node_facts("b", container=image, torch={"version": None, "error": "exit code 125"},
                        python={"path": "python3", "version": None,
                                "error": "Error: runc: runc create failed"})
    verdict = gate(*make({"a": node_facts("a"), "b": broken}, container={"image": "img:1"}))
    problem = verdict["problems"][0]
    assert (problem["host"], problem["check"]) == ("b", "python")
    assert problem["expected"] == "python3 in image img:1 runs"
    assert "podman run --rm img:1 python3 -V" in problem["fix"]


RUNC_NOFILE = ("Error: runc: runc create failed: unable to start container process: error during "
               "container init: error setting rlimits for ready process: error setting rlimit "
               "type 7: operation not permitted: OCI permission denied")


def refused(start):
    """A node whose podman has the image but could not start a container of it (node_facts'
    container.start), its interpreter and torch unread therefore."""
    found = {"runtime": "podman", "path": "/usr/bin/podman", "image": "img:1", "id": "5eb7",
             "pulled": False, "seconds": 0.1, "start": start,
             "error": f"podman run failed (exit code {start['exit']}): {start['said']}"}
    return node_facts("b", container=found, python={"path": "python3", "version": None,
                                                    "error": None},
                      torch={"version": None, "error": None, "cached": False})


def test_a_runtime_that_cannot_start_the_image_is_named_with_the_option_that_starts_it():
    node = refused({"exit": 126, "said": RUNC_NOFILE, "started": True,
                    "ulimits": ["--ulimit=nofile=20000:20000", "--ulimit=nproc=32768:32768"]})
    verdict = gate(*make({"a": node_facts("a"), "b": node}, container={"image": "img:1"}))
    assert [(p["host"], p["check"]) for p in verdict["problems"]] == [("b", "container runtime")]
    problem = verdict["problems"][0]
    assert problem["expected"] == "podman starts a container of image img:1"
    assert problem["found"] == f"podman run failed (exit code 126): {RUNC_NOFILE}"
    assert problem["fix"].startswith(
        "add options: ['--ulimit=nofile=20000:20000', '--ulimit=nproc=32768:32768'] to the "
        "job's container (container.options; with them the container started on this node)")
    assert "hard nofile, nproc limit" in problem["fix"]


@pytest.mark.parametrize("said,fix", [
    ("Error: crun: cgroups in hybrid mode not supported: OCI runtime error", 'runtime = "runc"'),
    ("Error: crun: open `/proc/sys/net/ipv4/ping_group_range`: Read-only file system: OCI "
     "runtime error", "default_sysctls = []"),
    ("Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=all",
     "nvidia-ctk cdi generate"),
    ("Error: some new failure: OCI runtime error",
     "run podman run --rm img:1 python3 -V on the node as the SSH user"),
])
def test_a_runtime_that_fails_otherwise_is_named_with_what_its_error_suggests(said, fix):
    node = refused({"exit": 126, "said": said, "ulimits": [], "started": False})
    verdict = gate(*make({"a": node_facts("a"), "b": node}, container={"image": "img:1"}))
    problem, = verdict["problems"]
    assert (problem["host"], problem["check"]) == ("b", "container runtime")
    assert said in problem["found"] and fix in problem["fix"]
