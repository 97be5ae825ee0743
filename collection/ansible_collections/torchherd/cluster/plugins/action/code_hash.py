# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.code_hash: on the controller, hash in this process.

The plan phase hashes the job's code on the controller before every launch; running the module
there would start an interpreter just to walk a directory. Over any other connection the module
runs on the target as usual.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import (
    MissingLibrary,
    code_hash,
)

_ARGS = {
    "path": {"type": "path", "required": True},
    "files": {"type": "list", "elements": "str", "default": []},
    "excludes": {"type": "list", "elements": "str", "default": []},
    "gitignore": {"type": "bool", "default": True},
    "explain": {"type": "list", "elements": "str", "default": []},
    "return_files": {"type": "bool", "default": False},
}
_LOCAL = ("local", "ansible.builtin.local")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if self._connection.transport not in _LOCAL or self._task.become:
            result.update(self._execute_module(task_vars=task_vars))
            return result
        args = self.validate_argument_spec(argument_spec=_ARGS)[1]
        path = os.path.expanduser(args["path"])
        if not os.path.isdir(path):
            raise AnsibleActionFail(f"code directory {path} does not exist")
        try:
            found = code_hash(path, args["files"], args["excludes"], args["gitignore"],
                              args["explain"])
        except MissingLibrary as exc:
            raise AnsibleActionFail(str(exc)) from exc
        if not args["return_files"]:
            found.pop("files", None)
        result.update(found)
        return result
