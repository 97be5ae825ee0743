# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The controller's run directory: claimed once per run id, its records written atomically, and
the times the launch's phases ended (marks.json). Shared by the actions run_record and
plan_run."""

from __future__ import annotations

import json
import os
import time

from ansible.errors import AnsibleActionFail

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_files import MARKS, read_json


def record(run_dir, files, claim=False, mark="", check_mode=False, once=False):
    """Write ``files`` (names relative to ``run_dir`` -> text) into the run directory, and
    ``mark`` (a phase's name) with the time now into marks.json. ``claim``: refuse a directory
    that holds a plan.json already (a run id names one run). ``once``: keep a time already
    recorded for ``mark`` (the first of several workers that end the same phase records it).
    Nothing is written in ``check_mode``. Returns the paths written (marks.json last) and the
    time."""
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    if claim and os.path.exists(os.path.join(run_dir, "plan.json")):
        raise AnsibleActionFail(
            f"job.run_id: expected a new run id, found run {os.path.basename(run_dir)} "
            f"already in {os.path.dirname(run_dir)}; a run id names one run: use "
            "status/stop/collect on it, or launch with another run id (or none, for a "
            "fresh one)")
    written = []
    for name, content in sorted(files.items()):
        if os.path.isabs(name) or ".." in name.split("/"):
            raise AnsibleActionFail(f"torchherd.cluster.run_record: file name {name!r} "
                                    "must be relative to run_dir and stay inside it")
        written.append(os.path.join(run_dir, name))
        if check_mode:
            continue
        os.makedirs(os.path.dirname(written[-1]), mode=0o755, exist_ok=True)
        write_atomic(written[-1], content if isinstance(content, str) else str(content),
                     mode=0o644)
    now = time.time()
    if mark:
        written.append(os.path.join(run_dir, MARKS))
    if not check_mode:
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        marks = (read_json(written[-1]) or {}) if mark else {}
        if mark and not (once and mark in marks):
            marks[mark] = now
            write_atomic(written[-1], json.dumps(marks, indent=2, sort_keys=True) + "\n",
                         mode=0o644)
    return run_dir, written, now
