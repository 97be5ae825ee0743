# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's container image on one node: the runtime that runs it (podman or docker, the
node's own, used by the SSH user without a prompt), the image there (or pulled as the job
allows), and the command line that runs a program inside it with what multi-node training
needs: the host's network (the interface the facts chose and the barrier proved is the job's),
the host's IPC namespace (NCCL's and the data loaders' shared memory), the GPUs, the synced code
and the run directory at the same paths as on the node, and the job's environment by name only
(values never on a command line). Secrets reach the job through its standard input (``SHIM``):
not on any command line, in no file, not in the container's configuration that ``inspect``
shows. Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

RUNTIMES = ("podman", "docker")
# How each runtime gives a container every GPU of the node: podman through the CDI spec the
# NVIDIA Container Toolkit generates (nvidia-ctk cdi generate), docker through its runtime hook.
GPU_OPTIONS = {"podman": ["--device", "nvidia.com/gpu=all"], "docker": ["--gpus", "all"]}
PULL_POLICIES = ("missing", "always", "never")
CHECK_TIMEOUT = 60
PULL_TIMEOUT = 3600
# What a runtime says of an image it does not have (podman, docker).
_ABSENT = re.compile(r"image not known|no such image|no such object|failed to find image",
                     re.IGNORECASE)
# Run inside the image before the launcher: takes the secrets, one JSON line on standard input,
# into the environment, then becomes the launcher (same pid, nothing left between).
SHIM = ("import json, os, sys\n"
        "os.environ.update(json.loads(sys.stdin.readline() or '{}'))\n"
        "os.execvp(sys.argv[1], sys.argv[1:])\n")


def find_runtime(wanted="auto"):
    """(name, path) of the runtime: the one named, or with auto the first of RUNTIMES on PATH;
    (None, None) where there is none."""
    for name in (RUNTIMES if wanted in ("", "auto") else (wanted,)):
        path = shutil.which(name)
        if path:
            return name, path
    return None, None


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][-400:] if lines else ""


def _run(argv, timeout):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def image_id(path, image, timeout=CHECK_TIMEOUT):
    """(id, None) where the runtime at `path` has `image`, (None, None) where it has not, and
    (None, what it said) where it cannot be asked (no permission, no daemon)."""
    proc = _run([path, "image", "inspect", "--format", "{{.Id}}", image], timeout)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.split()[0], None
    said = proc.stderr.strip() or proc.stdout.strip()
    if _ABSENT.search(said):
        return None, None
    return None, _last_line(said) or f"exit code {proc.returncode}"


def ensure(spec, dry=False):
    """The job's image on this node: {runtime, path, image, id, pulled, seconds, error}, pulled
    first where the policy (spec pull) says so; error (not an exception) says why the job cannot
    run in it here. `dry` (check mode) pulls nothing."""
    start = time.monotonic()
    wanted = spec.get("runtime") or "auto"
    name, path = find_runtime(wanted)
    image, policy = spec["image"], spec.get("pull") or "missing"
    found = {"runtime": name, "path": path, "image": image, "id": None, "pulled": False,
             "seconds": 0.0, "error": None}
    if not path:
        listed = " or ".join(RUNTIMES) if wanted in ("", "auto") else wanted
        found["error"] = f"no container runtime: expected {listed} on PATH, found none"
        return found
    try:
        ident, why = image_id(path, image)
        if why is None and (policy == "always" or (ident is None and policy == "missing")) \
                and not dry:
            pulled = _run([path, "pull", image], PULL_TIMEOUT)
            if pulled.returncode != 0:
                why = (f"{name} pull {image} failed: "
                       f"{_last_line(pulled.stderr or pulled.stdout)}")
            else:
                found["pulled"] = True
                ident, why = image_id(path, image)
        elif why is not None:
            why = f"{name} cannot be used here without a prompt: {why}"
        if why is None and ident is None:
            why = f"image {image} is not on this node " + (
                "and the job's pull policy is never" if policy == "never" else
                "(check mode pulls nothing)" if dry else f"after {name} pull")
    except subprocess.TimeoutExpired as exc:
        why = f"{name} did not answer in {exc.timeout:g} s ({' '.join(exc.cmd[1:3])})"
    found.update(id=ident if why is None else None, error=why,
                 seconds=round(time.monotonic() - start, 3))
    return found


def run_argv(found, *, name=None, mounts=(), workdir=None, env_names=(), gpus=False,
             stdin=False, volumes=(), options=()):
    """The command line that runs a program (appended by the caller) in the image `found`
    (ensure's answer; by its id, so that a tag moved since preflight does not change what
    runs), removed when it ends. `mounts`: directories of the node given to the container at
    the same paths; `volumes`, `options`: the job's own (runtime syntax); `env_names`: variables
    the container takes from the runtime's own environment, by name only."""
    runtime = found["runtime"]
    argv = [found["path"], "run", "--rm", "--network", "host", "--ipc", "host"]
    if name:
        argv += ["--name", name]
    if stdin:
        argv.append("--interactive")
    if gpus:
        argv += GPU_OPTIONS.get(runtime, [])
    if os.geteuid() != 0:
        # The job's files (logs, checkpoints) belong to the SSH user, as without a container.
        argv += ["--userns", "keep-id"] if runtime == "podman" else \
            ["--user", f"{os.geteuid()}:{os.getegid()}"]
    for path in dict.fromkeys(m for m in mounts if m):
        argv += ["--volume", f"{path}:{path}"]
    for volume in volumes:
        argv += ["--volume", volume]
    if workdir:
        argv += ["--workdir", workdir]
    for env_name in env_names:
        argv += ["--env", env_name]
    return argv + list(options) + [found["id"] or found["image"]]


def remove(found, name, timeout=CHECK_TIMEOUT):
    """Removes the container `name` (gone already is fine); what the runtime said where it
    failed, else None."""
    argv = [found["path"], "rm", "--force"] + (["--time", "0"] if found["runtime"] == "podman"
                                               else []) + [name]
    try:
        proc = _run(argv, timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    said = proc.stderr.strip()
    if proc.returncode == 0 or re.search(r"no such container|no container with", said, re.I):
        return None
    return _last_line(said) or f"exit code {proc.returncode}"


def container_name(run_id, node_rank, restart=0):
    """The job's container on a node: the run id, the node rank (nodes of one run may share a
    machine) and the whole-job restart (the one before may still be going away)."""
    return f"torchherd-{run_id}-n{node_rank}-r{restart or 0}"
