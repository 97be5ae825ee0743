"""ansible-runner underneath: a fresh private data dir per call, extra vars in a file, events.

Extra vars (the job, secret_env among them) go to ``<private>/env/extravars`` (0600, in a 0700
directory that is removed afterwards); ansible-playbook reads them with ``-e @file``, so they
never show on a command line (/proc/*/cmdline is world-readable).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from driver.paths import ansible_cfg, collections_path, playbook

Event = dict[str, Any]

# How often ansible-runner looks at the cancel callback: the latency of Ctrl-C, and while a
# job is watched nearly all the controller does (each look costs ~0.4 ms of CPU).
_POLL_SECONDS = 1.0


@dataclass
class Outcome:
    """What ansible-runner reported: its status, return code, per-host stats and failures."""

    status: str
    rc: int
    stats: dict[str, Any] = field(default_factory=dict)
    failures: list[Event] = field(default_factory=list)

    @property
    def cancelled(self) -> bool:
        return self.status == "canceled"

    def hosts_with(self, key: str) -> list[str]:
        return sorted(h for h, n in (self.stats.get(key) or {}).items() if n)


def secret_values(data: Any) -> list[str]:
    """Every value of every ``secret_env`` mapping in ``data``, longest first."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "secret_env" and isinstance(value, dict):
                found += [str(v) for v in value.values() if str(v)]
            else:
                found += secret_values(value)
    elif isinstance(data, list):
        for value in data:
            found += secret_values(value)
    return sorted(set(found), key=len, reverse=True)


def scrub(data: Any, hidden: list[str]) -> Any:
    """A copy of ``data`` with each hidden value replaced by ``********`` in every string."""
    if not hidden:
        return data
    if isinstance(data, str):
        for value in hidden:
            data = data.replace(value, "********")
        return data
    if isinstance(data, dict):
        return {scrub(k, hidden): scrub(v, hidden) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub(v, hidden) for v in data]
    return data


def _write_private(path: Path, data: Any) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)


def run_playbook(
    name: str,
    inventory: str | Path,
    extravars: dict[str, Any],
    on_event: Callable[[Event], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    verbosity: int = 0,
) -> Outcome:
    """Run one of the collection's playbooks and wait for it.

    ``on_event`` gets every ansible-runner event (in this thread), with the values of
    secret_env replaced wherever they appear (a second layer: the plan holds secret names only
    and the start task is no_log, but the values pass through the start task's arguments).
    ``cancelled`` is polled a
    few times a second; once it returns True the playbook is killed and the outcome's status
    is ``canceled``. Passing it also keeps ansible-runner's own SIGINT handler out of the way.
    """
    private = Path(tempfile.mkdtemp(prefix="torchherd-runner-"))  # 0700
    failures: list[Event] = []
    stats: dict[str, Any] = {}
    hidden = secret_values(extravars)

    def handle(event: Event) -> bool:
        event = scrub(event, hidden)
        kind = event.get("event")
        data = event.get("event_data", {})
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get(
                "ignore_errors"):
            failures.append(event)
        elif kind == "playbook_on_stats":
            stats.update({k: data.get(k) or {} for k in (
                "ok", "dark", "failures", "ignored", "rescued", "skipped", "changed")})
        if on_event:
            on_event(event)
        # False: ansible-runner keeps no copy of the events on disk (a second layer against a
        # secret value that some result might carry).
        return False

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
        _write_private(private / "env" / "extravars", extravars)
        result = ansible_runner.run(
            private_data_dir=str(private),
            playbook=str(playbook(name)),
            inventory=str(Path(inventory).resolve()),
            envvars=env,
            quiet=True,
            verbosity=verbosity or None,
            event_handler=handle,
            # Our own callback: without one ansible-runner installs its own SIGINT handler
            # (ansible-runner issue 1075) and Ctrl-C no longer reaches the caller.
            cancel_callback=cancelled,
            # No stdout file either: at higher verbosity it would hold task results.
            settings={"suppress_ansible_output": True, "suppress_output_file": True,
                      "job_timeout": 0, "pexpect_timeout": _POLL_SECONDS},
        )
        return Outcome(status=result.status, rc=result.rc, stats=stats, failures=failures)
    finally:
        # The private dir holds the extra vars (secrets among them): never leave it behind.
        shutil.rmtree(private, ignore_errors=True)
