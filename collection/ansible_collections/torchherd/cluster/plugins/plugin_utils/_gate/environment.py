# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's environment on each node: its venv or image, its interpreter with torch, and the
tools the run needs there (rsync, py-spy)."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem


def venv(host, f, plan):
    """The job's locked venv was made (or found) on the node."""
    made = f.get("venv") or {}
    if not made.get("error"):
        return []
    lock = (plan["job"].get("venv") or {}).get("lock")
    return [problem(host, "venv", f"a venv from {lock} made with uv at {made.get('path')}",
                    made["error"].strip()[-600:],
                    "check that the node reaches the job's venv.index_url or venv.find_links "
                    "and that every pinned version is there for its Python and platform; uv "
                    "comes from PATH, ~/.local/bin or a pip install (or set venv.uv)")]


def container(host, f, plan):
    """The job's image is on the node (or was pulled) and its runtime answers the SSH user."""
    found = f.get("container") or {}
    if not found.get("error") or found.get("start"):
        return []
    spec = plan.get("container") or {}
    image = spec.get("image") or found.get("image")
    error = found["error"]
    if not found.get("path"):
        fix = ("install podman, docker or apptainer on the node (or name the one there: "
               "container.runtime), or leave the node out of the inventory")
    elif "sandbox directory" in error:  # apptainer's image: a path that is not there
        fix = (f"copy the SIF file to {image} on the node (or to a shared file system), or give "
               "the image as a docker://, oras:// or library:// URI that the node pulls")
    elif "pull policy is never" in error and found.get("runtime") in ("apptainer", "singularity"):
        fix = "set container.pull to missing (the node pulls it once into its torchherd root)"
    elif "pull policy is never" in error:
        fix = (f"load the image on the node ({found.get('runtime')} pull {image}, or "
               f"{found.get('runtime')} load), or set container.pull to missing")
    elif "pull" in error:
        fix = ("check the image's name and that the node reaches its registry (and is logged "
               f"in: {found.get('runtime')} login as the SSH user), or load it there by hand")
    else:
        fix = ("let the SSH user run the runtime without a prompt (docker: the docker group; "
               "podman: rootless, or root), then try again")
    return [problem(host, "container",
                    f"image {image} runnable with {found.get('runtime') or spec.get('runtime')}",
                    error, fix)]


# What an OCI runtime's error says (lower case), and its fix, the first that matches, where it
# could not start a container for another reason than a resource limit.
START_FIXES = (
    ("cgroups in hybrid mode", 'crun refuses cgroups v1 hybrid mode: set runtime = "runc" under '
     "[engine] in the node's containers.conf"),
    ("/proc/sys/", "the node's /proc/sys is read-only (a node that is itself a container): set "
     "default_sysctls = [] under [containers] in its containers.conf"),
    ("/sys/fs/cgroup", "the node's cgroup tree is read-only or not the runtime's (a node that is "
     'itself a container): set cgroups = "disabled" under [containers] and runtime = "crun" '
     "under [engine] in its containers.conf"),
    ("mount 'proc' to 'proc'", "the node lacks CAP_SYS_ADMIN (a node that is itself a "
     "container): start it with that capability, or run the job without an image"),
    ("default oci runtime", "install the OCI runtime it names (crun or runc), or name the one "
     "there: runtime under [engine] in the node's containers.conf"),
    # The GPUs (run_argv's GPU_OPTIONS): podman through CDI, docker through its runtime hook.
    ("unresolvable cdi devices", "generate the node's CDI spec of its GPUs with the NVIDIA "
     "Container Toolkit (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"),
    ("could not select device driver", "install the NVIDIA Container Toolkit on the node and "
     "configure docker for it (nvidia-ctk runtime configure --runtime=docker, then restart "
     "docker)"),
)


def runtime_starts(host, f, plan):
    """The runtime starts a container of the job's image on the node, as the job's run will
    (its options and volumes): read on every preflight, cached torch facts or not."""
    found = f.get("container") or {}
    start = found.get("start")
    if not start:
        return []
    runtime, image = found.get("runtime"), found.get("image")
    py = f["python"].get("path")
    if start.get("ulimits"):
        options = ", ".join(f"'{option}'" for option in start["ulimits"])
        limits = ", ".join(option.split("=")[1] for option in start["ulimits"])
        fix = (f"add options: [{options}] to the job's container (container.options; "
               + ("with them the container started on this node" if start.get("started") else
                  "the container still failed with them: run it by hand to see why")
               + f"), or raise the SSH user's hard {limits} limit on the node to the runtime's "
               f"default (or set default_ulimits in its containers.conf)")
    else:
        fix = next((fix for said, fix in START_FIXES if said in start["said"].lower()),
                   f"run {runtime} run --rm {image} {py} -V on the node as the SSH user and "
                   "fix what the runtime says (its configuration, storage or the job's "
                   "container.options)")
    return [problem(host, "container runtime",
                    f"{runtime} starts a container of image {image}", found["error"], fix)]


def interpreter(host, f, plan):
    """The job's interpreter runs and imports torch."""
    py, torch = f["python"], f["torch"]
    if (f.get("venv") or {}).get("error") or (f.get("container") or {}).get("error"):
        return []  # the venv's (the image's) problem says why its interpreter is not there
    if "took more than" in (torch.get("error") or ""):
        # The probe ran out of time: the interpreter is there, it says nothing of its version.
        return [problem(host, "torch", f"torch importable by {py.get('path')} "
                        "within the facts' probe timeout", torch["error"],
                        "the node was too busy or its file system too slow: try "
                        "again, or launch with fewer forks (fewer nodes import "
                        "torch at once where they share a machine or a file "
                        "system); the answer is cached once it came")]
    image = f.get("container") or {}
    where = f" in image {image.get('image')}" if image else ""
    if py.get("error") or not py.get("version"):
        fix = (f"check that {image.get('runtime')} runs the image on this node "
               f"({image.get('runtime')} run --rm {image.get('image')} {py.get('path')} -V), "
               "or set container.python to the image's interpreter" if image else
               "set torchherd_job.python to an interpreter that exists on every node")
        return [problem(host, "python", f"{py.get('path')}{where} runs",
                        py.get("error") or "no version", fix)]
    if torch.get("error") or not torch.get("version"):
        fix = ("use an image with torch, or set container.python to the image's interpreter "
               "that has it" if image else
               f"install torch for {py.get('path')} (pip install torch), "
               f"or set torchherd_job.python to the venv that has it")
        return [problem(host, "torch", f"torch importable by {py.get('path')}{where}",
                        torch.get("error"), fix)]
    return []


def rsync(host, f, plan):
    if f.get("rsync"):
        return []
    return [problem(host, "rsync", "rsync on the node", "not found",
                    "install rsync on the node (apt-get install rsync)")]


def py_spy(host, f, plan):
    """The hang watch reads the ranks' stacks with py-spy."""
    hang_timeout = plan["job"].get("hang_timeout")
    if not hang_timeout or f.get("py_spy"):
        return []
    py = f["python"].get("path")
    return [problem(
        host, "py-spy", f"py-spy next to {py} or on PATH, to read every "
        f"rank's stack once the job hangs (hang_timeout {hang_timeout} s)",
        "not found", f"{py} -m pip install py-spy on the node (a static "
        "binary, no build), or leave hang_timeout at 0")]


# The checks of one node's own facts, in the order their problems are listed.
NODE_CHECKS = (venv, container, runtime_starts, interpreter, rsync, py_spy)
