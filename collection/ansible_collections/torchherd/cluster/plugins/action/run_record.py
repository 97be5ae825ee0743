# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.run_record: the controller's run directory, written in-process."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_record import record

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
        run_dir, written, now = record(args["run_dir"], args["files"], args["claim"],
                                       args["mark"], self._task.check_mode)
        result.update(changed=bool(written) or args["claim"], run_dir=run_dir, files=written,
                      written_at=now)
        return result
