# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's container image on one node: the runtime that runs it (podman, docker or apptainer,
the node's own, used by the SSH user without a prompt), the image there (or pulled as the job
allows), and the command line that runs a program inside it with what multi-node training
needs: the host's network (the interface the facts chose and the barrier proved is the job's),
the host's IPC namespace (NCCL's and the data loaders' shared memory), the GPUs, the synced code
and the run directory at the same paths as on the node, and the job's environment by name only
(values never on a command line). Secrets reach the job through its standard input (``SHIM``):
not on any command line, in no file, not in the container's configuration that ``inspect``
shows.

apptainer (and SingularityCE, its sibling with the same command line) keeps no images of its
own and runs no daemon: the image is a SIF file (or a sandbox directory) on the node, or a URI
(docker://, oras://, library://) that is pulled into a SIF file under torchherd's root. Its
processes are the host's (the host's network, IPC and PID namespaces, the user's own uid), so
there is no container to name or remove. It starts from a clean environment (``--cleanenv``)
and takes the job's variables from ``APPTAINERENV_<name>`` (``runtime_env``), so that the
node's PATH and Python do not leak into the image, as with the other runtimes.
Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import subprocess
import time

RUNTIMES = ("podman", "docker", "apptainer", "singularity")
# The runtimes that run a SIF file from the node's file system, with the prefix of the host
# variables they put into the container's environment under the rest of the name.
SIF_RUNTIMES = {"apptainer": "APPTAINERENV_", "singularity": "SINGULARITYENV_"}
# What names an image apptainer pulls (anything else is a SIF file or sandbox directory).
SIF_URI = re.compile(r"^(docker|oras|library|shub|https?)://")
# How each runtime gives a container every GPU of the node: podman through the CDI spec the
# NVIDIA Container Toolkit generates (nvidia-ctk cdi generate), docker through its runtime hook,
# apptainer by binding the driver's libraries and devices (--nv).
GPU_OPTIONS = {"podman": ["--device", "nvidia.com/gpu=all"], "docker": ["--gpus", "all"],
               "apptainer": ["--nv"], "singularity": ["--nv"]}
PULL_POLICIES = ("missing", "always", "never")
CHECK_TIMEOUT = 60
PULL_TIMEOUT = 3600
# What a runtime says of an image it does not have (podman, docker).
_ABSENT = re.compile(r"image not known|no such image|no such object|failed to find image",
                     re.IGNORECASE)
# The exit codes of a run that the runtime failed to start (podman and docker: 125, its own
# error; 126, the OCI runtime could not start the container; apptainer: 255, FATAL). 127 (the
# command is not in the image) and the command's own codes are the probe's to tell.
START_FAILED = {"podman": (125, 126), "docker": (125, 126), "apptainer": (255,),
                "singularity": (255,)}
# Linux's resource limits as the OCI runtimes name one they could not set: runc by its number
# ("error setting rlimit type 7"), crun by its name ("setrlimit `RLIMIT_NOFILE`"); to the name
# --ulimit takes.
ULIMITS = ("cpu", "fsize", "data", "stack", "core", "rss", "nproc", "nofile", "memlock", "as",
           "locks", "sigpending", "msgqueue", "nice", "rtprio", "rttime")
_RLIMIT = re.compile(r"rlimit type (\d+)|RLIMIT_([A-Z]+)")
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


def _stamp(path):
    """What tells one state of a SIF file (or sandbox directory) from another: the torch probe's
    cache is kept while it is the same."""
    info = os.stat(path)
    return f"{info.st_size}-{info.st_mtime_ns}"


def sif_path(image, cache_dir):
    """Where apptainer's image lives on the node: the file (or directory) named, or for a URI the
    SIF file it is pulled into under `cache_dir`, named after the URI (readable, and unique by a
    hash of it)."""
    if not SIF_URI.match(image):
        return os.path.abspath(os.path.expanduser(image))
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", SIF_URI.sub("", image))[-80:]
    digest = hashlib.sha256(image.encode()).hexdigest()[:12]
    return os.path.join(os.path.expanduser(cache_dir or "~/.torchherd/images"),
                        f"{readable}-{digest}.sif")


def _ensure_sif(found, spec, dry):
    """apptainer's half of ensure: the SIF file there, or pulled into it as the policy says.
    The answer's id is the file (what runs); its stamp stands for the file's content."""
    image, policy, name = spec["image"], spec.get("pull") or "missing", found["runtime"]
    path = sif_path(image, spec.get("cache_dir"))
    pullable = bool(SIF_URI.match(image))
    there = os.path.exists(path)
    why = None
    if not pullable and not there:
        why = (f"image {image} is not on this node ({name} runs a SIF file or sandbox directory "
               "there, or pulls one given as a docker://, oras:// or library:// URI)")
    elif pullable and (policy == "always" or (not there and policy == "missing")) and not dry:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.part-{os.getpid()}"
        try:
            pulled = _run([found["path"], "pull", "--force", partial, image], PULL_TIMEOUT)
            if pulled.returncode != 0:
                why = f"{name} pull {image} failed: {_last_line(pulled.stderr or pulled.stdout)}"
            else:
                os.replace(partial, path)  # a launch beside this one never sees half a file
                found["pulled"] = True
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    elif not there:
        why = f"image {image} is not on this node " + (
            "and the job's pull policy is never" if policy == "never" else
            "(check mode pulls nothing)")
    if why is None and os.path.exists(path):
        found.update(id=path, stamp=_stamp(path))
    elif why is None:
        why = f"image {image} is not on this node after {name} pull"
    return why


def ensure(spec, dry=False):
    """The job's image on this node: {runtime, path, image, id, pulled, seconds, error, start},
    pulled first where the policy (spec pull) says so; error (not an exception) says why the job
    cannot run in it here; start is check_start's answer, where the caller asks for it. `dry`
    (check mode) pulls nothing. For apptainer (SIF_RUNTIMES) the id is the SIF file, pulled
    under spec's cache_dir where the image is a URI, and `stamp` (its size and time) stands for
    its content."""
    start = time.monotonic()
    wanted = spec.get("runtime") or "auto"
    name, path = find_runtime(wanted)
    image, policy = spec["image"], spec.get("pull") or "missing"
    found = {"runtime": name, "path": path, "image": image, "id": None, "pulled": False,
             "seconds": 0.0, "error": None, "start": None}
    if not path:
        listed = (", ".join(RUNTIMES[:-1]) + " or " + RUNTIMES[-1]) if wanted in ("", "auto") \
            else wanted
        found["error"] = f"no container runtime: expected {listed} on PATH, found none"
        return found
    if name in SIF_RUNTIMES:
        try:
            why = _ensure_sif(found, spec, dry)
        except subprocess.TimeoutExpired as exc:
            why = f"{name} did not answer in {exc.timeout:g} s ({' '.join(exc.cmd[1:3])})"
        except OSError as exc:
            why = f"{name}: {exc}"
        found.update(error=why, seconds=round(time.monotonic() - start, 3))
        if why is not None:
            found.update(id=None)
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


def _refused_limit(said):
    """The limit (its --ulimit name) that the OCI runtime could not set, as it said, or None."""
    match = _RLIMIT.search(said or "")
    if not match:
        return None
    if match.group(1):
        number = int(match.group(1))
        return ULIMITS[number] if number < len(ULIMITS) else None
    name = match.group(2).lower()
    return name if name in ULIMITS else None


def _ulimit(name):
    """--ulimit for the limit `name` at the hard limit this user has on the node, which the
    runtime can set where its default is above it (None where there is none to name). nproc no
    higher than the kernel's pid_max (no more processes can exist): podman lowers its own hard
    nproc limit to that."""
    number = getattr(resource, f"RLIMIT_{name.upper()}", None)
    hard = resource.getrlimit(number)[1] if number is not None else resource.RLIM_INFINITY
    if name == "nproc":
        try:
            with open("/proc/sys/kernel/pid_max", encoding="ascii") as handle:
                pid_max = int(handle.read())
        except (OSError, ValueError):
            pid_max = None
        if pid_max and (hard == resource.RLIM_INFINITY or hard > pid_max):
            hard = pid_max
    if hard == resource.RLIM_INFINITY:
        return None  # the runtime may set any value: something else refused it
    return f"--ulimit={name}={hard}:{hard}"


def check_start(found, command, *, gpus=False, volumes=(), options=(), timeout=CHECK_TIMEOUT):
    """Whether the runtime starts a container of the image `found` (ensure's answer, without
    error) as the job's run will (its volumes and options), running `command` in it: None
    where it does, else {exit, said (the runtime's own error line), ulimits, started}. Where
    the OCI runtime could not set a resource limit (the runtime's default above the node's
    hard limit), the run is tried again with --ulimit at the node's limit added for each one
    refused: `ulimits` are those options and `started` whether the container started with
    them."""
    added, failed = [], None
    while True:
        argv = run_argv(found, gpus=gpus, volumes=volumes, options=list(options) + added)
        try:
            proc = _run(argv + list(command), timeout)
        except subprocess.TimeoutExpired as exc:
            return {"exit": None, "said": f"{found['runtime']} did not start a container in "
                    f"{exc.timeout:g} s", "ulimits": added, "started": False}
        if proc.returncode not in START_FAILED.get(found["runtime"], ()):
            break
        said = _last_line(proc.stderr or proc.stdout) or f"exit code {proc.returncode}"
        failed = failed or {"exit": proc.returncode, "said": said}
        limit = _refused_limit(said)
        option = limit and _ulimit(limit)
        if not option or option in added:
            return dict(failed, ulimits=added, started=False)
        added.append(option)
    return dict(failed, ulimits=added, started=True) if failed else None


def run_argv(found, *, name=None, mounts=(), workdir=None, env_names=(), gpus=False,
             stdin=False, volumes=(), options=()):
    """The command line that runs a program (appended by the caller) in the image `found`
    (ensure's answer; by its id, so that a tag moved since preflight does not change what
    runs), removed when it ends. `mounts`: directories of the node given to the container at
    the same paths; `volumes`, `options`: the job's own (runtime syntax); `env_names`: variables
    the container takes from the runtime's own environment, by name only."""
    runtime = found["runtime"]
    if runtime in SIF_RUNTIMES:
        return _sif_argv(found, mounts, workdir, gpus, volumes, options)
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
    argv += _shared(mounts, volumes, workdir, "--volume", "--workdir")
    for env_name in env_names:
        argv += ["--env", env_name]
    return argv + list(options) + [found["id"] or found["image"]]


def _sif_argv(found, mounts, workdir, gpus, volumes, options):
    """apptainer's run: the host's network, IPC and PIDs are its default; a clean environment
    (the job's variables come from runtime_env); the same directories bound at their paths."""
    argv = [found["path"], "exec", "--cleanenv"]
    if gpus:
        argv += GPU_OPTIONS[found["runtime"]]
    argv += _shared(mounts, volumes, workdir, "--bind", "--pwd")
    return argv + list(options) + [found["id"] or found["image"]]


def _shared(mounts, volumes, workdir, mount_flag, workdir_flag):
    """The node's directories at their own paths, the job's volumes and the working directory,
    in a runtime's flags (podman and docker: --volume, --workdir; apptainer: --bind, --pwd)."""
    argv = []
    for path in dict.fromkeys(m for m in mounts if m):
        argv += [mount_flag, f"{path}:{path}"]
    for volume in volumes:
        argv += [mount_flag, volume]
    if workdir:
        argv += [workdir_flag, workdir]
    return argv


def runtime_env(found, env, names):
    """What the runtime's own environment needs beside `env` so that the container gets the
    variables `names` (their values from `env`): podman and docker take them by name (run_argv's
    --env), apptainer from its prefixed copies."""
    prefix = SIF_RUNTIMES.get((found or {}).get("runtime"))
    if not prefix:
        return {}
    return {prefix + name: env[name] for name in names if name in env}


def remove(found, name, timeout=CHECK_TIMEOUT):
    """Removes the container `name` (gone already is fine); what the runtime said where it
    failed, else None. apptainer leaves no container behind: nothing to remove."""
    if found.get("runtime") in SIF_RUNTIMES:
        return None
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
