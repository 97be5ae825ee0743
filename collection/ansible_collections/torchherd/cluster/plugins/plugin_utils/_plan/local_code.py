# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The nodes on this machine against the job's code: a node's root or code directory inside
code_src is part of the code, and the sync copies it into itself at every launch (the copies
of all earlier launches with it: gigabytes after a few)."""

from __future__ import annotations

import os

from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import (
    TORCHHERDIGNORE,
    MissingLibrary,
    Rules,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.entries import (
    DEFAULT_ROOT,
    code_dest,
    node_root,
)

LOCAL_CONNECTIONS = ("local", "ansible.builtin.local")


def on_this_machine(hv):
    """Whether the node's paths are paths of this machine: its connection is local, the one
    over which the sync copies to a local path. An SSH node at a loopback address is not taken
    for this machine: its login may be another user (another ~), or a container or VM behind a
    forwarded port, whose paths say nothing about this machine's code_src."""
    return str(hv.get("ansible_connection") or "") in LOCAL_CONNECTIONS


def resolved(path):
    """``path`` as the sync on this machine reaches it: ~ expanded, relative to this process's
    directory (ansible-playbook's, where the sync's rsync runs too), symlinks resolved (the code
    is listed from code_src resolved, and symlinks in it are sent as links, never followed)."""
    return os.path.realpath(os.path.expanduser(path))


def _inside(path, src):
    """``path`` relative to ``src`` ('.' for src itself), or None where it is outside."""
    rel = os.path.relpath(path, src)
    return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _checked(hv, job):
    """(the variable, its value, what to set it to, whether it may be code_src itself) for each
    directory of the node that the launch writes."""
    given = hv.get("torchherd_root")
    found = [("torchherd_root" if given else f"torchherd_root (default {DEFAULT_ROOT})",
              node_root(hv), "set torchherd_root to a directory outside code_src", False)]
    dest = code_dest(job, hv)
    if dest:
        key = "torchherd_code_dest" if hv.get("torchherd_code_dest") else "job.code_dest"
        # A copy onto itself adds nothing: only a code directory below code_src grows.
        found.append((key, dest, f"set {key} to a directory outside code_src, or leave it "
                      f"empty (<root>/code/<name>)", True))
    return found


def nested_code_problems(job, hosts, hvs):
    """Why the sync would copy a node's own directories into the code, for each of ``hosts``
    on this machine whose root (or code directory) lies inside code_src and is not left out of
    the code by the sync's ignore rules (the job's excludes, .gitignore, .torchherdignore)."""
    src = resolved(job["code_src"] or ".")
    rules = None
    problems = []
    for host in hosts:
        if not on_this_machine(hvs[host]):
            continue
        for key, given, fix, same_ok in _checked(hvs[host], job):
            path = resolved(given)
            rel = _inside(path, src)
            if rel is None or (rel == os.curdir and same_ok):
                continue
            expected = (f"host {host}: {key}: expected a directory outside code_src {src} (the "
                        f"node is this machine, and the sync copies code_src to it at every "
                        f"launch: a node's directory inside code_src is copied into itself, "
                        f"launch after launch)")
            found = given if given == path else f"{given} ({path})"
            if rel == os.curdir:
                problems.append(f"{expected}, found {found}, code_src itself; fix: {fix}")
                break
            rel = rel.replace(os.sep, "/")
            try:
                rules = rules or Rules(src, job["excludes"], job["gitignore"])
                if rules.explain(rel, is_dir=True):
                    continue
            except MissingLibrary as exc:
                problems.append(f"host {host}: {key} inside code_src: {exc}")
                break
            problems.append(f"{expected}, found {found} inside it and part of the code; fix: "
                            f"{fix}, or leave it out of the code with the line /{rel}/ in "
                            f"{src}/{TORCHHERDIGNORE}")
            break
    return problems
