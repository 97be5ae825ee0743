"""``torchherd disconnect``: close the SSH connections this controller keeps open to the nodes
between runs, now instead of when their idle time runs out.

A run keeps each node's SSH connection open after its last use (ssh's ControlPersist: ten
minutes where the caller's Ansible configuration sets no ssh_args, driver.runner.OWN_SSH_ARGS;
theirs otherwise), so that a relaunch pays no node's handshake again. The disconnect playbook
asks Ansible to reset each node's connection (meta reset_connection): ssh closes the master on
this controller, with the node's own SSH settings (user, port, ControlPath). Nothing changes on
the nodes, and a node need not answer: a node without a kept connection has nothing to close.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from driver.inputs import inventory_source
from driver.outcomes import first_message
from driver.result import Exit
from driver.runner import Event, run_playbook


@dataclass
class DisconnectReport:
    """What ``disconnect`` did: the inventory whose nodes' kept connections were closed."""

    inventory: str
    exit_code: Exit = Exit.OK
    reason: str = ""

    def to_dict(self) -> dict[str, object]:
        """The ``disconnect --json`` document (driver/schema.json, disconnect)."""
        return {"action": "disconnect", "inventory": self.inventory,
                "exit_code": int(self.exit_code), "exit_name": self.exit_code.name.lower(),
                "reason": self.reason}


def disconnect(inventory: str | Path, *, on_event: Callable[[Event], None] | None = None,
               verbosity: int = 0) -> DisconnectReport:
    """Close the SSH connections kept open to every host of ``inventory`` (within the limit of
    -l); a host without one is left as it is."""
    source = inventory_source(inventory)
    outcome = run_playbook("disconnect", source, {}, on_event=on_event, verbosity=verbosity)
    report = DisconnectReport(str(source))
    if outcome.rc != 0:
        report.exit_code, report.reason = Exit.ERROR, first_message(outcome)
    return report
