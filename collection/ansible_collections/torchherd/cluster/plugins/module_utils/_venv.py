# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's locked venv on one node: made with uv from a lock (a requirements file whose every
requirement is pinned, or uv's own uv.lock), or reused where the same lock made it before.

A venv lives at ``<root>/venvs/<key>``, the key the plan's hash of the lock and of the options
that shape the venv, so an unchanged lock finds its venv (one stat), a changed one makes a new
one beside it, and a launch never changes a venv another run uses. ``.torchherd-venv.json`` is
written last: a venv without it (a make that died) is made again. uv is the node's (``uv``
option, PATH, ``~/.local/bin``, ``<python> -m uv``), else installed the way uv documents, with
pip, into ``<root>/tools/uv`` (pip's ``--target``: no user site, no system packages touched).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from urllib.parse import urlsplit

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic

MARKER = ".torchherd-venv.json"
LOCK_FILE = "torchherd-lock.txt"
# What a failed command leaves in the answer: its last lines, enough to say why.
TAIL = 1200


class VenvError(Exception):
    """The venv could not be made; the message says which step and what it said."""


def _run(argv, env=None, timeout=1800):
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip())[-TAIL:]
        raise VenvError(f"{os.path.basename(argv[0])} {' '.join(argv[1:3])} exited with "
                        f"{proc.returncode}: {said}")
    return proc.stdout


def _index_args(index_url, find_links):
    """uv's and pip's options for where packages come from: a wheelhouse alone means no index."""
    args = []
    if index_url:
        args += ["--index-url", index_url]
    for link in find_links:
        args += ["--find-links", link]
    if find_links and not index_url:
        args.append("--no-index")
    return args


def find_uv(given, python, root):
    """The uv to use: the one given, on PATH, in ~/.local/bin, torchherd's own, or python -m uv."""
    candidates = [given] if given else []
    candidates += [shutil.which("uv") or "", os.path.expanduser("~/.local/bin/uv"),
                   os.path.join(root, "tools", "uv", "bin", "uv")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return [path]
    if python:
        try:
            if subprocess.run([python, "-m", "uv", "--version"], capture_output=True,
                              timeout=60, check=False).returncode == 0:
                return [python, "-m", "uv"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def install_uv(python, root, index_url, find_links):
    """uv installed with pip, as uv documents, into torchherd's own directory. pip ignores an
    index or wheelhouse served over plain HTTP unless told to trust it: the job named it."""
    target = os.path.join(root, "tools", "uv")
    trusted = []
    for url in [index_url] + list(find_links):
        if url.startswith("http://"):
            trusted += ["--trusted-host", urlsplit(url).hostname or ""]
    try:
        _run([python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
              "--target", target, "--upgrade", "uv"] + _index_args(index_url, find_links)
             + trusted, timeout=600)
    except (OSError, VenvError) as exc:
        raise VenvError(f"uv is not on the node and pip could not install it: {exc}") from exc
    return [os.path.join(target, "bin", "uv")]


def ensure(path, lock, key, python, root, index_url="", find_links=(), system_site_packages=False,
           uv="", install=True, dry=False, project=None):
    """The venv at ``path`` for ``lock`` (its text): reused where its marker has ``key``, else
    made (``dry``: only said, as check mode wants). With ``project`` (a pyproject.toml's text)
    the lock is uv's own (uv.lock): uv exports it to pinned requirements first.
    Returns {path, python, key, made, seconds, uv, packages}."""
    started = time.time()
    path = os.path.expanduser(path)
    venv_python = os.path.join(path, "bin", "python")
    marker = os.path.join(path, MARKER)
    answer = {"path": path, "python": venv_python, "key": key, "made": False}
    done = _read(marker)
    if done.get("key") == key and os.path.exists(venv_python):
        return dict(answer, seconds=round(time.time() - started, 3), uv=done.get("uv"),
                    packages=done.get("packages"), made_at=done.get("made_at"))
    if dry:
        return dict(answer, seconds=0.0, missing=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Two launches on one node (another run, the same lock) make it once: the second waits.
    with open(path + ".lock", "a", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = _read(marker)
        if done.get("key") == key and os.path.exists(venv_python):
            return dict(answer, seconds=round(time.time() - started, 3), uv=done.get("uv"),
                        packages=done.get("packages"), made_at=done.get("made_at"))
        uv_argv = find_uv(uv, python, root) or (
            install_uv(python, root, index_url, list(find_links)) if install else None)
        if not uv_argv:
            raise VenvError("uv not found on the node (PATH, ~/.local/bin, "
                            f"{python} -m uv)")
        env = dict(os.environ, UV_CACHE_DIR=os.path.join(root, "cache", "uv"),
                   UV_NO_PROGRESS="1", UV_PYTHON_DOWNLOADS="never")
        version = _run(uv_argv + ["--version"], env=env).strip()
        shutil.rmtree(path, ignore_errors=True)
        _run(uv_argv + ["venv", "--quiet", "--python", python, path]
             + (["--system-site-packages"] if system_site_packages else []), env=env)
        if system_site_packages:
            _see_base_venv(python, venv_python)
        lock_path = os.path.join(path, LOCK_FILE)
        if project is None:
            with open(lock_path, "w", encoding="utf-8") as handle:
                handle.write(lock)
        else:
            _export(uv_argv, env, os.path.join(path, ".project"), lock, project, lock_path)
        # Compiled now, once: a job's interpreter may not write bytecode (read-only files,
        # PYTHONDONTWRITEBYTECODE), and compiling torch at every import costs seconds per rank.
        _run(uv_argv + ["pip", "sync", "--quiet", "--compile-bytecode", "--python", venv_python,
                        lock_path]
             + _index_args(index_url, list(find_links)), env=env)
        frozen = _run(uv_argv + ["pip", "freeze", "--python", venv_python], env=env)
        record = {"key": key, "uv": version, "made_at": time.time(),
                  "packages": [line for line in frozen.splitlines() if line.strip()]}
        write_atomic(marker, json.dumps(record))
    return dict(answer, made=True, seconds=round(time.time() - started, 3), uv=version,
                packages=record["packages"], made_at=record["made_at"])


# Where a Python's own packages are, and whether it is a venv itself.
_SITE = ("import json, site, sys; print(json.dumps([sys.prefix != sys.base_prefix, "
         "site.getsitepackages()]))")
BASE_PTH = "_torchherd_base_venv.pth"


def _see_base_venv(python, venv_python):
    """A venv made from a venv's Python sees, with --system-site-packages, the packages of the
    interpreter beneath (uv makes it from there), not those of the venv the node's torch is in.
    Those come after the venv's own through a .pth file, as the job means by the node's own
    packages."""
    is_venv, base_sites = json.loads(_run([python, "-c", _SITE]))
    if not is_venv:
        return
    own_sites = json.loads(_run([venv_python, "-c", _SITE]))[1]
    with open(os.path.join(own_sites[0], BASE_PTH), "w", encoding="utf-8") as handle:
        handle.write("".join(f"{site}\n" for site in base_sites))


def _export(uv_argv, env, where, lock, project, out):
    """uv's lock (and its project) as the pinned requirements uv exports: uv's defaults (the
    dev group too), the project itself left out (its code is the synced code)."""
    os.makedirs(where, exist_ok=True)
    for name, text in (("uv.lock", lock), ("pyproject.toml", project)):
        with open(os.path.join(where, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    _run(uv_argv + ["export", "--quiet", "--frozen", "--no-emit-project", "--no-header",
                    "--format", "requirements-txt", "--project", where, "--output-file", out],
         env=env)


def _read(marker):
    try:
        with open(marker, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}
