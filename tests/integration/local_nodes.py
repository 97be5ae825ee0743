"""The embedded default's nodes (inventories/local.ini: two nodes on this machine), as the
tests that launch on them see them."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.helpers import REPO

LOCAL_INI = REPO / "inventories" / "local.ini"


def node_roots(home: Path | None = None) -> list[Path]:
    """local.ini's torchherd_root of each node: a run lives in <root>/runs/<run_id> there, its
    code in <root>/code/<job name>. The roots are under ~, which the nodes (this user on this
    machine) resolve by HOME: ``home`` where a launch runs with another one."""
    given = re.findall(r"torchherd_root=(\S+)", LOCAL_INI.read_text())
    if home is None:
        return [Path(p).expanduser() for p in given]
    return [home / p.removeprefix("~/") for p in given]


NODE_ROOTS = node_roots()


def live_processes_of(node_run_dir: Path) -> list[int]:
    """Processes of a node's run on this machine: those whose environment carries the run's
    marker (TORCHHERD_RUN, as every process torchherd starts for the run has it). Zombies are
    not counted: this sandbox's init may never reap an orphan that has exited."""
    want = f"TORCHHERD_RUN={node_run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone meanwhile, or another user's
        if state != "Z":
            found.append(int(entry.name))
    return found
