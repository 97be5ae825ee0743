# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.run_record: the controller's run directory, written in-process."""

from __future__ import annotations

import json
import os
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_files import MARKS, read_json

_ARGS = {
    "run_dir": {"type": "path", "required": True},
    "claim": {"type": "bool", "default": False},
    "files": {"type": "dict", "default": {}},
    "mark": {"type": "str", "default": ""},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=_ARGS)[1]
        run_dir = os.path.abspath(os.path.expanduser(args["run_dir"]))
        marker = os.path.join(run_dir, "plan.json")
        if args["claim"] and os.path.exists(marker):
            raise AnsibleActionFail(
                f"job.run_id: expected a new run id, found run {os.path.basename(run_dir)} "
                f"already in {os.path.dirname(run_dir)}; a run id names one run: use "
                "status/stop/collect on it, or launch with another run id (or none, for a "
                "fresh one)")
        written = []
        for name, content in sorted(args["files"].items()):
            if os.path.isabs(name) or ".." in name.split("/"):
                raise AnsibleActionFail(f"torchherd.cluster.run_record: file name {name!r} "
                                        "must be relative to run_dir and stay inside it")
            written.append(os.path.join(run_dir, name))
            if self._task.check_mode:
                continue
            os.makedirs(os.path.dirname(written[-1]), mode=0o755, exist_ok=True)
            write_atomic(written[-1], content if isinstance(content, str) else str(content),
                         mode=0o644)
        now = time.time()
        if args["mark"]:
            written.append(os.path.join(run_dir, MARKS))
        if not self._task.check_mode:
            os.makedirs(run_dir, mode=0o755, exist_ok=True)
            if args["mark"]:
                marks = read_json(written[-1]) or {}
                marks[args["mark"]] = now
                write_atomic(written[-1], json.dumps(marks, indent=2, sort_keys=True) + "\n",
                             mode=0o644)
        result.update(changed=bool(written) or args["claim"], run_dir=run_dir, files=written,
                      written_at=now)
        return result
