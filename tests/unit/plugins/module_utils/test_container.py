"""The job's image on a node: the runtime found, the image looked for and pulled as the policy
says, what a runtime that cannot be asked said, and the command line that runs the launcher in
the image. The runtime here is a script that answers as podman does (its real words)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import _container

# A podman that has the images listed in $IMAGES (a file), pulls those in $REGISTRY, and
# records every call in $CALLS; its messages are podman 4's.
FAKE = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$1 $2" in
"image inspect")
    for image in $(/bin/cat "$IMAGES"); do
        [ "$image" = "$5" ] && { echo "sha256-of-$5"; exit 0; }
    done
    [ -n "$DENIED" ] && { echo "Error: cannot connect: permission denied" >&2; exit 125; }
    echo "Error: inspecting object: $5: image not known" >&2; exit 125 ;;
"pull "*)
    /bin/grep -qx "$2" "$REGISTRY" || { echo "Trying to pull $2..." >&2;
        echo "Error: initializing source docker://$2: reading manifest: manifest unknown" >&2;
        exit 125; }
    echo "$2" >> "$IMAGES"; echo "sha256-of-$2" ;;
"rm --force")
    echo "Error: no container with name or ID \\"$5\\" found: no such container" >&2; exit 1 ;;
esac
"""


def fake_runtime(tmp_path, monkeypatch, name, script, files):
    """`script` as the runtime `name`, alone on PATH (beside any other fake of this test), with
    its empty state files, each named in the variable of its upper-cased name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(script)
    (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    for file in files:
        (tmp_path / file).write_text("")
        monkeypatch.setenv(file.upper(), str(tmp_path / file))
    return tmp_path


@pytest.fixture
def podman(tmp_path, monkeypatch):
    return fake_runtime(tmp_path, monkeypatch, "podman", FAKE, ("images", "registry", "calls"))


def calls(podman):
    return [line.split()[0] for line in (podman / "calls").read_text().splitlines()]


def test_an_image_there_is_used_and_one_missing_is_pulled_as_the_policy_says(podman):
    (podman / "images").write_text("localhost/train:1\n")
    found = _container.ensure({"image": "localhost/train:1", "pull": "missing"})
    assert (found["runtime"], found["id"], found["pulled"], found["error"]) == (
        "podman", "sha256-of-localhost/train:1", False, None)
    assert found["path"].endswith("/podman") and calls(podman) == ["image"]

    (podman / "registry").write_text("registry.example/train:2\n")
    found = _container.ensure({"image": "registry.example/train:2", "pull": "missing"})
    assert found["pulled"] and found["id"] == "sha256-of-registry.example/train:2"
    # always pulls what is there; never refuses what is not.
    assert _container.ensure({"image": "localhost/train:1", "pull": "always"})["error"] \
        == "podman pull localhost/train:1 failed: Error: initializing source " \
           "docker://localhost/train:1: reading manifest: manifest unknown"
    never = _container.ensure({"image": "localhost/other:3", "pull": "never"})
    assert never["id"] is None and never["error"] == (
        "image localhost/other:3 is not on this node and the job's pull policy is never")
    # Check mode pulls nothing.
    dry = _container.ensure({"image": "registry.example/new:4"}, dry=True)
    assert "check mode pulls nothing" in dry["error"] and "pull" not in calls(podman)[-1:]


def test_no_runtime_or_one_that_cannot_be_asked_is_said(podman, monkeypatch):
    monkeypatch.setenv("DENIED", "1")
    found = _container.ensure({"image": "localhost/train:1"})
    assert found["error"] == ("podman cannot be used here without a prompt: Error: cannot "
                              "connect: permission denied")
    assert calls(podman) == ["image"]  # nothing pulled
    assert _container.ensure({"image": "x", "runtime": "docker"})["error"] == (
        "no container runtime: expected docker on PATH, found none")
    monkeypatch.setenv("PATH", str(podman / "none"))
    assert _container.ensure({"image": "x"})["error"] == (
        "no container runtime: expected podman, docker, apptainer or singularity on PATH, "
        "found none")


def test_the_command_line_runs_in_the_image_with_what_training_needs(monkeypatch):
    found = {"runtime": "podman", "path": "/usr/bin/podman", "image": "localhost/train:1",
             "id": "5eb7d3349f43"}
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    argv = _container.run_argv(
        found, name="torchherd-r1-n0-r0", mounts=["/code", "/runs/r1", "/code"], workdir="/code",
        env_names=["MASTER_ADDR", "TH_TOKEN_NAME_ONLY"], gpus=True, stdin=True,
        volumes=["/data:/data:ro"], options=["--shm-size=16g"])
    assert argv == [
        "/usr/bin/podman", "run", "--rm", "--network", "host", "--ipc", "host",
        "--name", "torchherd-r1-n0-r0", "--interactive", "--device", "nvidia.com/gpu=all",
        "--volume", "/code:/code", "--volume", "/runs/r1:/runs/r1", "--volume", "/data:/data:ro",
        "--workdir", "/code", "--env", "MASTER_ADDR", "--env", "TH_TOKEN_NAME_ONLY",
        "--shm-size=16g", "5eb7d3349f43"]
    # docker's GPUs; a user who is not root keeps its own uid for the job's files.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    docker = _container.run_argv(dict(found, runtime="docker", path="/usr/bin/docker", id=""),
                                 gpus=True)
    assert docker == ["/usr/bin/docker", "run", "--rm", "--network", "host", "--ipc", "host",
                      "--gpus", "all", "--user", "1000:1000", "localhost/train:1"]
    assert "--userns" in _container.run_argv(found)


def test_the_shim_takes_the_secrets_from_stdin_and_becomes_the_program(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _container.SHIM, sys.executable, "-c",
                          "import os; print(os.environ['TH_TOKEN'], os.getpid())"],
                         input='{"TH_TOKEN": "t0ken"}\n', capture_output=True, text=True,
                         check=True)
    assert out.stdout.split()[0] == "t0ken"


def test_a_container_already_gone_is_no_error_and_names_carry_the_run(podman):
    found = {"runtime": "podman", "path": str(podman / "bin" / "podman")}
    assert _container.remove(found, "torchherd-r1-n0-r0") is None
    assert (podman / "calls").read_text().split() == ["rm", "--force", "--time", "0",
                                                      "torchherd-r1-n0-r0"]
    assert _container.container_name("r1", 2, 1) == "torchherd-r1-n2-r1"


# An apptainer that pulls the URIs listed in $REGISTRY into the file it is given, and records
# every call in $CALLS; its failure is apptainer 1.3's words.
FAKE_APPTAINER = """#!/bin/sh
echo "$*" >> "$CALLS"
[ "$1 $2" = "pull --force" ] || exit 2
/bin/grep -qx "$4" "$REGISTRY" || { echo "FATAL:   While making image from oci registry: \
error fetching image: manifest unknown" >&2; echo partial > "$3"; exit 255; }
echo "SIF of $4 $(/bin/date +%s%N)" > "$3"
"""


@pytest.fixture
def apptainer(tmp_path, monkeypatch):
    return fake_runtime(tmp_path, monkeypatch, "apptainer", FAKE_APPTAINER, ("registry", "calls"))


def test_apptainer_runs_a_sif_file_there_and_pulls_a_uri_into_the_root_as_the_policy_says(
        apptainer):
    cache = apptainer / "root" / "images"
    sif = apptainer / "train.sif"
    sif.write_text("a SIF")
    found = _container.ensure({"image": str(sif), "pull": "always", "cache_dir": str(cache)})
    # A file is what it is: nothing to pull, its path is what runs, its size and time its stamp.
    assert (found["runtime"], found["id"], found["pulled"], found["error"]) == (
        "apptainer", str(sif), False, None)
    assert found["stamp"] and calls(apptainer) == []
    missing = _container.ensure({"image": str(apptainer / "gone.sif"), "cache_dir": str(cache)})
    assert missing["id"] is None and "is not on this node (apptainer runs a SIF file" in \
        missing["error"]

    uri = "docker://registry.example/train:2"
    (apptainer / "registry").write_text(uri + "\n")
    spec = {"image": uri, "pull": "missing", "cache_dir": str(cache)}
    first = _container.ensure(spec)
    assert first["pulled"] and first["error"] is None
    assert first["id"] == _container.sif_path(uri, str(cache)) and first["id"].startswith(
        str(cache) + "/registry.example_train_2-")
    assert Path(first["id"]).read_text().startswith(f"SIF of {uri}")
    # missing: there now, found without a pull; always: pulled again.
    again = _container.ensure(spec)
    assert (again["pulled"], again["id"], again["stamp"]) == (False, first["id"], first["stamp"])
    assert calls(apptainer) == ["pull"]
    fresh = _container.ensure(dict(spec, pull="always"))
    assert fresh["pulled"] and fresh["id"] == first["id"]
    assert calls(apptainer) == ["pull", "pull"]
    # never refuses what is not there; check mode pulls nothing; a failed pull leaves no file.
    other = "oras://registry.example/other:3"
    never = _container.ensure({"image": other, "pull": "never", "cache_dir": str(cache)})
    assert never["error"] == (f"image {other} is not on this node and the job's pull policy "
                              "is never")
    dry = _container.ensure({"image": other, "cache_dir": str(cache)}, dry=True)
    assert "check mode pulls nothing" in dry["error"] and calls(apptainer) == ["pull", "pull"]
    failed = _container.ensure({"image": other, "cache_dir": str(cache)})
    assert failed["id"] is None and failed["error"] == (
        f"apptainer pull {other} failed: FATAL:   While making image from oci registry: error "
        "fetching image: manifest unknown")
    assert sorted(os.listdir(cache)) == [os.path.basename(first["id"])]


def test_auto_takes_podman_or_docker_before_apptainer(apptainer, podman):
    # Both fixtures made their bin directory in the same tmp_path: podman and apptainer there.
    assert _container.find_runtime("auto")[0] == "podman"
    os.unlink(apptainer / "bin" / "podman")
    assert _container.find_runtime("auto")[0] == "apptainer"
    assert _container.find_runtime("singularity") == (None, None)


def test_apptainer_runs_the_file_with_a_clean_environment_and_the_jobs_variables_as_its_own():
    found = {"runtime": "apptainer", "path": "/usr/bin/apptainer", "image": "docker://x/train:1",
             "id": "/root/.torchherd/images/x_train_1-0123456789ab.sif"}
    argv = _container.run_argv(
        found, name="torchherd-r1-n0-r0", mounts=["/code", "/runs/r1", "/code"], workdir="/code",
        env_names=["MASTER_ADDR"], gpus=True, stdin=True, volumes=["/data:/data:ro"],
        options=["--writable-tmpfs"])
    assert argv == [
        "/usr/bin/apptainer", "exec", "--cleanenv", "--nv", "--bind", "/code:/code",
        "--bind", "/runs/r1:/runs/r1", "--bind", "/data:/data:ro", "--pwd", "/code",
        "--writable-tmpfs", found["id"]]
    assert _container.runtime_env(found, {"MASTER_ADDR": "10.0.0.1", "PATH": "/usr/bin"},
                                  ["MASTER_ADDR", "UNSET"]) == {
        "APPTAINERENV_MASTER_ADDR": "10.0.0.1"}
    assert _container.runtime_env(dict(found, runtime="singularity"), {"A": "1"}, ["A"]) == {
        "SINGULARITYENV_A": "1"}
    assert _container.runtime_env(dict(found, runtime="podman"), {"A": "1"}, ["A"]) == {}
    # No container object: nothing to remove, nothing run.
    assert _container.remove(found, "torchherd-r1-n0-r0") is None


# What podman 4.3 with runc said on a Debian machine that is itself a container (root, hard
# nofile limit 20000 below podman's default), once per limit it could not set (recorded); and
# crun's words for a limit and for cgroups v1 hybrid mode, after its error line.
RUNC_RLIMIT = ("Error: runc: runc create failed: unable to start container process: error "
               "during container init: error setting rlimits for ready process: error setting "
               "rlimit type {}: operation not permitted: OCI permission denied")
CRUN_RLIMIT = "Error: crun: setrlimit RLIMIT_NOFILE: Operation not permitted: OCI permission denied"
CGROUPS = "Error: crun: cgroups in hybrid mode not supported: OCI runtime error"

# A podman whose run fails as $SAYS (its %s: the limit's number) for every word of $REFUSED
# (a limit's name) not given with --ulimit, or else exits with $CODE.
STARTS = """#!/bin/sh
echo "$*" >> "$CALLS"
[ "$1" = run ] || exit 0
for word in $REFUSED; do
    case "$*" in
    *--ulimit=$word=*) ;;
    *) printf "$SAYS\\n" $(case $word in nofile) echo 7;; nproc) echo 6;; esac) >&2; exit 126 ;;
    esac
done
exit ${CODE:-0}
"""


@pytest.fixture
def starts(tmp_path, monkeypatch):
    runtime = fake_runtime(tmp_path, monkeypatch, "podman", STARTS, ("calls",))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return {"runtime": "podman", "path": str(runtime / "bin" / "podman"),
            "image": "localhost/train:1", "id": "5eb7d3349f43"}


def test_a_start_refused_by_a_limit_is_tried_again_at_the_nodes_limit(
        starts, tmp_path, monkeypatch):
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    monkeypatch.setenv("SAYS", RUNC_RLIMIT.replace("{}", "%s"))
    monkeypatch.setenv("REFUSED", "nofile nproc")
    found = _container.check_start(starts, ["python3", "-c", ""], options=["--shm-size=1g"])
    assert found["exit"] == 126 and found["said"] == RUNC_RLIMIT.format(7)
    assert found["started"] is True
    assert found["ulimits"][0] == f"--ulimit=nofile={nofile}:{nofile}"
    assert found["ulimits"][1].startswith("--ulimit=nproc=")
    assert int(found["ulimits"][1].split(":")[1]) <= resource.getrlimit(resource.RLIMIT_NPROC)[1]
    # The job's own options first, then those tried; the job's interpreter with nothing to run.
    assert (tmp_path / "calls").read_text().splitlines()[-1].endswith(
        f"--shm-size=1g {' '.join(found['ulimits'])} 5eb7d3349f43 python3 -c ")
    # crun names the limit.
    monkeypatch.setenv("SAYS", CRUN_RLIMIT)
    monkeypatch.setenv("REFUSED", "nofile")
    assert _container.check_start(starts, ["python3"])["ulimits"] == [
        f"--ulimit=nofile={nofile}:{nofile}"]
    # The job's own option at the node's limit: the container starts.
    assert _container.check_start(starts, ["python3"], options=["--ulimit=nofile=1:1"]) is None


def test_a_start_that_fails_otherwise_is_said_and_a_missing_command_is_the_probes(
        starts, monkeypatch):
    # Started: the command's own exit code, or 127 (not in the image: the probe says so).
    for code in ("0", "1", "127"):
        monkeypatch.setenv("CODE", code)
        assert _container.check_start(starts, ["python3", "-c", ""]) is None
    monkeypatch.setenv("SAYS", CGROUPS)
    monkeypatch.setenv("REFUSED", "cgroups")
    assert _container.check_start(starts, ["python3"]) == {
        "exit": 126, "said": CGROUPS, "ulimits": [], "started": False}
