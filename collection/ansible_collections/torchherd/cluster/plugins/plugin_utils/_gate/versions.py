# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The versions the nodes must share: the job's launcher installed everywhere, and the match
keys (Python's minor version, torch's, its CUDA and NCCL, the launcher's) equal."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem


def _launcher_key(name):
    """The fact key of a launcher's installed version (node_facts's torch.launchers)."""
    return f"torch.launchers.{name}"


DEFAULT_MATCH = ["python.minor", "torch.version", "torch.cuda", "torch.nccl"]

FIXES = {
    "python.minor": "use the same Python minor version everywhere: one venv built the same "
                    "way on every node, named by torchherd_job.python (or torchherd_python)",
    "torch.version": "install the same torch on every node (pip install torch==<version> in the "
                     "job's venv), or point torchherd_job.python at the venv that has it",
    "torch.cuda": "install the torch build for the same CUDA version on every node",
    "torch.nccl": "install the same torch build (it bundles NCCL) on every node",
}
FIXES.update({_launcher_key(name): launcher.FIX for name, launcher in LAUNCHERS.items()
              if launcher.FIX})


def _minor(facts):
    version = str((facts.get("python") or {}).get("version") or "")
    return ".".join(version.split(".")[:2]) or None


# Keys compared that are not facts themselves but derived from them.
DERIVED = {"python.minor": _minor}


def _get(facts, dotted):
    if dotted in DERIVED:
        return DERIVED[dotted](facts)
    value = facts
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def launcher_installed(usable, launcher):
    """The job's launcher is installed for the job's interpreter (torchrun comes with torch)."""
    if not launcher.DISTRIBUTION:
        return []
    name = launcher.NAME
    problems = []
    for host, f in usable.items():
        if not (f["torch"].get("launchers") or {}).get(name):
            py = f["python"].get("path")
            problems.append(problem(host, name, f"{name} installed for {py} (launcher {name})",
                                    "not installed",
                                    f"pip install {launcher.DISTRIBUTION} with {py} (the job's "
                                    f"Python), or set torchherd_job.python to the venv that "
                                    f"has it"))
    return problems


def _match_keys(match, launcher):
    """The keys compared across nodes: the given ones, and the job's launcher's version."""
    keys = DEFAULT_MATCH if match is None else list(match)
    return keys + [_launcher_key(launcher.NAME)] if launcher.DISTRIBUTION else keys


def versions_match(usable, master, keys):
    """Every key equal on every node to the master's (the first usable node's without it)."""
    reference_host = master if master in usable else next(iter(usable), None)
    if not reference_host:
        return []
    ref = usable[reference_host]
    problems = []
    for key in keys:
        for host, f in usable.items():
            if key.startswith("torch.launchers.") and None in (_get(f, key), _get(ref, key)):
                continue  # a missing launcher is its own problem (launcher_installed)
            if host != reference_host and _get(f, key) != _get(ref, key):
                problems.append(problem(host, f"same {key}",
                                        f"{_get(ref, key)} (as on {reference_host})",
                                        _get(f, key), FIXES.get(key, "make the nodes equal")))
    return problems


def checks(run):
    """The launcher on every node, then the versions equal."""
    return (launcher_installed(run.usable, run.launcher)
            + versions_match(run.usable, run.plan["master"]["host"],
                             _match_keys(run.match, run.launcher)))


CHECKS = (checks,)
