# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.run_summary: write summary.json in the controller's own process.

The run directory is on the controller by definition, so there is no module to ship and no
interpreter to start (that cost ~0.4 s per launch, status, stop and collect).
"""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_files import MARKS, read_json
from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_record import record
from ansible_collections.torchherd.cluster.plugins.plugin_utils._summary import (
    resolved_plan,
    write_summary,
)

_ARGS = {
    "run_dir": {"type": "path", "required": True},
    "plan": {"type": "dict", "required": True},
    "results": {"type": "dict", "required": True},
    "marks": {"type": "dict", "default": {}},
    "not_asked": {"type": "list", "elements": "str", "default": []},
    "mark": {"type": "str", "default": ""},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=_ARGS)[1]
        run_dir = os.path.expanduser(args["run_dir"])
        if args["mark"]:  # the phase that ends as the summary begins (a launch's collect)
            record(run_dir, {}, mark=args["mark"])
        # The phases' ends as the launch recorded them (run_record's mark), the task's over them.
        marks = {**(read_json(os.path.join(run_dir, MARKS)) or {}), **args["marks"]}
        # Here, not in the task's arguments: templated there, the plan's redaction and
        # preflight's values took a fifth of the task's time, between the job's end and the
        # command's return.
        summary, text, path = write_summary(run_dir, resolved_plan(run_dir, args["plan"]),
                                            args["results"], marks, args["not_asked"])
        result.update(changed=True, summary=summary, table=text, path=path)
        return result
