"""A playbook's outcome made into the run's RunResult, and the driver's note in the run
directory (driver.json): the inventory a launch used, and the verdicts no summary.json tells."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from driver.result import DRIVER_FILE, Exit, RunResult, UsageError, read_json, read_result
from driver.runner import Outcome

# ansible-core's account of where a plugin failed ("Task failed: Finalization of task args for
# 'ansible.builtin.set_fact' failed: Error while resolving value for 'torchherd_plan': The
# filter plugin 'torchherd.cluster.plan' failed: ..."), in front of the plugin's own message.
_ANSIBLE_WRAPPER = re.compile(r"^(?:Task failed: |Finalization of task args for '[^']*' failed: "
                              r"|Error while resolving value for '[^']*': "
                              r"|The \w+ plugin '[^']*' failed: )+")


def first_message(outcome: Outcome) -> str:
    for event in outcome.failures:
        data = event.get("event_data", {})
        res = data.get("res", {})
        msg = _ANSIBLE_WRAPPER.sub("", str(res.get("msg") or res.get("stderr") or ""))
        if msg:
            host = data.get("host", "")
            if "Host key verification failed" in msg:
                msg += _HOST_KEY_FIX.format(host=host, address=data.get("remote_addr") or host)
            return f"{host}: {msg}" if host and host != "localhost" else str(msg)
    if outcome.errors:
        return outcome.errors[0]
    return f"ansible-runner ended {outcome.status} (rc {outcome.rc})"


# Host key checking stays on; the driver runs SSH in batch mode, so an unknown key is an error.
_HOST_KEY_FIX = (" (ssh host key check: expected the host key of {host} ({address}) in "
                 "known_hosts, found it unknown or changed; fix: check the key's fingerprint with "
                 "the node's owner and add it, e.g. ssh-keyscan {address} >> ~/.ssh/known_hosts "
                 "after comparing, or turn checking off yourself with host_key_checking = False "
                 "in your ansible.cfg)")


def result_of(run_dir: Path, action: str, outcome: Outcome) -> RunResult:
    result = read_result(run_dir, action, outcome.rc, first_message(outcome))
    if result.state == "invalid":
        # The plan refused the input (or Ansible the inventory) before any node was touched:
        # bad input, as the driver's own checks find it, so raised the same way.
        raise UsageError(result.reason)
    return result


def remember_inventory(run_dir: Path, inventory: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DRIVER_FILE).write_text(json.dumps({"inventory": str(inventory)}) + "\n",
                                       encoding="utf-8")


def forget_unplanned(run_dir: Path) -> None:
    """A launch that never got its plan leaves no run behind."""
    if not (run_dir / "plan.json").exists():
        (run_dir / DRIVER_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something else lives there
            run_dir.rmdir()


def cancelled_result(run_dir: Path, reason: str, state: str | None = None,
               action: str = "launch") -> RunResult:
    """The result of a cancelled action; for a launch, with ``state`` (where the summary
    cannot tell it, e.g. nothing had started) noted in the run directory for runs()."""
    result = read_result(run_dir, action, 0, reason)
    result.exit_code, result.reason = Exit.CANCELLED, reason
    if state is not None:
        result.state = state
        note_verdict(run_dir, "cancelled", state, reason)
    return result


def note_verdict(run_dir: Path, key: str, state: str, reason: str) -> None:
    """The verdict of a run no summary.json tells (runs() reads it): in the driver's note."""
    note = read_json(run_dir / DRIVER_FILE) or {}
    note[key] = {"state": state, "reason": reason}
    (run_dir / DRIVER_FILE).write_text(json.dumps(note) + "\n", encoding="utf-8")
