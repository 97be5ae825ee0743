"""Node logs, read back on the controller with each line named by its host and global rank.

torchrun (``--tee 3``) prefixes every line a worker writes with ``[default<local_rank>]:``. With
static rendezvous the global rank is ``node_rank * nproc_per_node + local_rank``, so the line
becomes ``<host> r<rank>: ...``; with elastic (c10d) rendezvous ranks are assigned at run time
and the line keeps the local rank, ``<host> l<local_rank>: ...``. torchrun's own lines read
``<host> agent: ...``. The same convention as the collection's merged.log (run_summary), which
the driver cannot import; the driver also reads logs as they grow, and learns the number of
processes per node from preflight.json when the plan said 'auto'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LOCAL = re.compile(r"^\[default(\d+)\]:")
# torch's own "[rankN]:" on a worker's stderr repeats what the new prefix says.
_RANK = re.compile(r"^\[rank(\d+)\]: ?")


@dataclass(frozen=True)
class LogLine:
    """One line of one node's log."""

    host: str
    node_rank: int | None
    local_rank: int | None
    rank: int | None  # global rank, when static rendezvous makes it known
    text: str

    @property
    def label(self) -> str:
        """``r<rank>``, ``l<local_rank>``, or ``agent`` for a line of torchrun itself."""
        if self.rank is not None:
            return f"r{self.rank}"
        return f"l{self.local_rank}" if self.local_rank is not None else "agent"

    @property
    def short(self) -> str:
        """The line without its host, and without a label for torchrun's own lines."""
        return self.text if self.local_rank is None else f"{self.label}: {self.text}"

    def __str__(self) -> str:
        return f"{self.host} {self.label}: {self.text}"


def parse_line(host: str, node_rank: int | None, nproc: int | None, raw: str) -> LogLine:
    """Name one raw node-log line. ``nproc`` is None when global ranks are not fixed."""
    match = _LOCAL.match(raw)
    if not match:
        return LogLine(host, node_rank, None, None, raw)
    local = int(match.group(1))
    text = raw[match.end():]
    rank = node_rank * nproc + local if nproc is not None and node_rank is not None else None
    inner = _RANK.match(text)
    if inner and rank is not None and int(inner.group(1)) == rank:
        text = text[inner.end():]
    return LogLine(host, node_rank, local, rank, text)


def static_nproc(plan: dict[str, Any], preflight: dict[str, Any] | None) -> int | None:
    """Processes per node when global ranks follow node ranks (static rendezvous), else None.
    A plan with nproc_per_node 'auto' learns the number in preflight (the gate)."""
    if (plan.get("job") or {}).get("rdzv", "static") != "static":
        return None
    for value in (((preflight or {}).get("gate") or {}).get("nproc_per_node"),
                  plan.get("nproc_per_node")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class LogTail:
    """The lines of a growing file not read yet. The file may be replaced (rsync writes a new
    copy each time) but only grows; a shorter file means a new one, read from the start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self, final: bool = False) -> list[str]:
        """New complete lines; with ``final`` also an unterminated last line."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(0, 2)
                if handle.tell() < self.offset:
                    self.offset = 0
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        end = len(data) if final else data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace").splitlines()
