"""ansible-runner underneath: a fresh private data dir per call, extra vars in a file, events."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from driver.paths import ansible_cfg, collections_path, playbook

Event = dict[str, Any]


@dataclass
class Outcome:
    """What ansible-runner reported: its status, return code and per-host stats."""

    status: str
    rc: int
    stats: dict[str, Any] = field(default_factory=dict)
    failures: list[Event] = field(default_factory=list)

    def hosts_with(self, key: str) -> list[str]:
        return sorted(h for h, n in (self.stats.get(key) or {}).items() if n)


def run_playbook(
    name: str,
    inventory: str | Path,
    extravars: dict[str, Any],
    on_event: Callable[[Event], None] | None = None,
    cancel: threading.Event | None = None,
    verbosity: int = 0,
) -> Outcome:
    """Run one of the collection's playbooks; extra vars go to a 0600 file, never to argv."""
    private = Path(tempfile.mkdtemp(prefix="torchherd-runner-"))
    failures: list[Event] = []

    def handle(event: Event) -> bool:
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            data = event.get("event_data", {})
            if not data.get("ignore_errors"):
                failures.append(event)
        if on_event:
            on_event(event)
        # False would drop the event from the artifacts; we keep nothing there anyway.
        return True

    env = {
        "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # ansible-playbook of this interpreter's environment, also when it is not activated.
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    cfg = ansible_cfg()
    if cfg:
        env["ANSIBLE_CONFIG"] = str(cfg)
    try:
        result = ansible_runner.run(
            private_data_dir=str(private),
            playbook=str(playbook(name)),
            inventory=str(Path(inventory).resolve()),
            extravars=extravars,
            envvars=env,
            quiet=True,
            verbosity=verbosity or None,
            event_handler=handle,
            # Our own callback: without it ansible-runner takes over SIGINT and Ctrl-C stops
            # working in the caller.
            cancel_callback=(lambda: cancel.is_set()) if cancel else (lambda: False),
            settings={"suppress_ansible_output": True, "job_timeout": 0},
        )
        return Outcome(status=result.status, rc=result.rc, stats=result.stats or {},
                       failures=failures)
    finally:
        # The private dir holds the extra vars (secrets among them): never leave it behind.
        shutil.rmtree(private, ignore_errors=True)


def ensure_private_umask() -> None:
    """Files ansible-runner writes (extra vars) must not be readable by others."""
    os.umask(os.umask(0o077) | 0o077)
