# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the job runs in on the nodes: the job's image, or a venv made from its lock."""

from __future__ import annotations

import hashlib
import os
import re


def container(job, problems):
    """The job's image, runtime, pull policy and interpreter (None without an image)."""
    spec = job.get("container") or {}
    if not spec.get("image"):
        unused = sorted(k for k, v in spec.items() if v not in (None, "", [], "auto", "missing",
                                                                "python3"))
        if unused:
            problems.append(f"job.container: expected an image with {', '.join(unused)}, found "
                            "none; fix: set container.image, or leave container out")
        return None
    if (job.get("venv") or {}).get("lock"):
        problems.append("job.container and job.venv: expected one of them (a venv is made on "
                        "the node, an image brings its own interpreter), found both; fix: "
                        "install the lock into the image, or leave container out")
    if job.get("spawn") == "srun":
        problems.append("job.container with spawn srun: expected spawn ssh or auto, found "
                        "srun; fix: run the image with SLURM's own container support "
                        "(srun --container-image), or set spawn to ssh")
    return {"image": str(spec["image"]), "runtime": str(spec.get("runtime") or "auto"),
            "pull": str(spec.get("pull") or "missing"),
            "python": str(spec.get("python") or "python3")}


def venv(job, problems):
    """The hash of the job's lock and of what else shapes its venv (None without a lock).

    The lock is read here, on the controller, so that a lock that is missing or pins nothing is
    refused before any node is touched; preflight sends its text to the nodes."""
    spec = job.get("venv") or {}
    if not spec.get("lock"):
        return None
    src = os.path.realpath(os.path.expanduser(job.get("code_src") or "."))
    path = os.path.join(src, spec["lock"])
    uv_lock = os.path.basename(path) == "uv.lock"
    # uv's own lock pins by construction; it is its project's, whose pyproject.toml is beside it.
    wanted = [(path, f"a lock file inside code_src {src}",
               "give its path relative to code_src (uv pip compile requirements.in -o "
               "requirements.lock makes one)")]
    if uv_lock:
        wanted.append((os.path.join(os.path.dirname(path), "pyproject.toml"),
                       f"pyproject.toml beside {spec['lock']} (uv's lock is its project's)",
                       "sync the project's directory, or export a requirements lock (uv export "
                       "--format requirements-txt -o requirements.lock)"))
    texts = []
    for where, expected, fix in wanted:
        try:
            with open(where, encoding="utf-8") as handle:
                texts.append(handle.read())
        except OSError as exc:
            problems.append(f"job.venv.lock: expected {expected}, found "
                            f"{exc.strerror or exc} at {where}; fix: {fix}")
            return None
    loose = [] if uv_lock else unpinned(texts[0])
    if loose:
        problems.append(f"job.venv.lock: expected every requirement in {spec['lock']} pinned "
                        f"with == (a lock), found {', '.join(loose[:5])}; fix: make the lock "
                        f"with uv pip compile (or uv export --format requirements-txt)")
        return None
    texts.append(str(bool(spec.get("system_site_packages"))))
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()


def unpinned(text):
    """The requirements of a requirements file that pin no version (a lock pins them all)."""
    joined = re.sub(r"\\\n", " ", text)
    loose = []
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not line or line.startswith(("--hash", "--index-url", "--extra-index-url",
                                        "--find-links", "--no-index", "-i ", "-f ")):
            continue
        requirement = line.split(";", 1)[0].split(" --hash", 1)[0].strip()
        if line.startswith("-") or not (re.search(r"[^=!<>~]===?[^=]", requirement)
                                        or " @ " in requirement):
            loose.append(requirement)
    return loose


def node_python(job, hv, image):
    """The interpreter a node runs the job with, before any venv: the node's, else the job's,
    else in the job's ``image`` the image's (the node's own is not there), else the node's
    Ansible interpreter."""
    return str(hv.get("torchherd_python") or job["python"]
               or (image["python"] if image else hv.get("ansible_python_interpreter")) or "")


def node_venv(lock_hash, root, python):
    """The node's venv under ``root``, made from ``python``: its key also hashes the
    interpreter, so nodes with other interpreters get venvs of their own."""
    key = hashlib.sha256(f"{lock_hash}\0{python}".encode()).hexdigest()[:16]
    return {"path": f"{root}/venvs/{key}", "key": key, "base_python": python}
