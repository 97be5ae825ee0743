# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.node_facts: the module with its option `arguments` spread into
its arguments (plugin_utils/_node_args.py), and ssh's own reason where Ansible lost it.

With pipelining Ansible writes the module to ssh's stdin at once. Where ssh has already ended
(an unknown host key, a refused key), the write fails and Ansible reports only "Data could not
be sent to remote host ... Broken pipe": ssh's own words are lost. Here the node is then asked
once more, in the same worker, with a command that sends nothing, and the node is unreachable
with what ssh said to that (the gate names an unknown host key from it). Any other result is
the module's as it came.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.plugin_utils._node_args import (
    job_secrets,
    spread_arguments,
)

# Ansible's words where ssh ended before the module could be written to it.
_NOT_SENT = "could not be sent"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = spread_arguments(self._task.args)
        name = args.pop("secret_env_var", None)
        if args.get("start") and name:
            # A relaunch's start in this call: the job's secret values join it here, as in the
            # torchrun_job action, so that no task argument holds them.
            args["start_secret_env"] = job_secrets(self._templar, task_vars, name)
        try:
            result.update(self._execute_module(module_args=args, task_vars=task_vars))
        except AnsibleConnectionFailure as lost:
            if _NOT_SENT not in str(lost):
                raise
            try:
                self._low_level_execute_command("true", sudoable=False)
            except AnsibleConnectionFailure as reason:
                raise AnsibleConnectionFailure(str(reason)) from lost
            raise
        if isinstance(result.get("start"), dict):
            # As torchrun_job's action stamps every answer (the summary's timings).
            result["start"]["received_at"] = time.time()
        return result
