# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.torchrun_job: secrets that no task argument holds, and a wait
that survives one SSH hiccup.

The module runs on the node as usual. With secret_env_var, the secret values of the job that
variable holds join the module's arguments here, at run time: callbacks see every task's
arguments once templated (no_log does not hide them from a callback that records results),
so the start task names the variable and holds no value.

With state=waiting, a call that cannot reach the node is made once more on a fresh connection
before the node counts as lost: a busy controller or a lost packet must not stop a healthy job.
Doing it here rather than in a second task keeps the watch at one task per node; a task that
is only there for the rare case still costs the controller a worker per node on every launch,
even where it is skipped.

Every answer gets C(received_at), the controller's time when it came back: with the node's own
C(checked_at) it gives how far that node's clock is off, so that times of different nodes can
be compared (summary.json's root cause, timings) without the clocks agreeing.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.vars import merge_hash


class ActionModule(NormalAction):
    """The module as any other (temporary files, async), with a second try for a wait."""

    def run(self, tmp=None, task_vars=None):
        result = self._run(tmp, task_vars)
        if isinstance(result, dict) and result.get("checked_at") is not None:
            result["received_at"] = time.time()
        return result

    def _run(self, tmp, task_vars):
        if self._task.args.get("secret_env_var"):
            return self._run_with_secrets(tmp, task_vars)
        if self._task.args.get("state") != "waiting":
            return super().run(tmp, task_vars)
        try:
            return super().run(tmp, task_vars)
        except AnsibleConnectionFailure as first:
            host = (task_vars or {}).get("inventory_hostname", "the node")
            self._display.warning(f"{host}: no answer over SSH while its job runs ({first}); "
                                  "asking once more on a fresh connection")
        try:
            self._connection.reset()
        except Exception:  # pylint: disable=broad-except  # a dead master may not stop cleanly
            pass
        try:
            return super().run(tmp, task_vars)
        except AnsibleConnectionFailure as second:
            # A plain result, not the exception: the task's failed_when decides whether a lost
            # node fails the watch (static rendezvous) or is left to torchrun (elastic).
            return {"unreachable": True, "lost": True, "changed": False,
                    "msg": f"the node did not answer over SSH twice while its job ran: it "
                           f"counts as lost ({second})"}

    def _run_with_secrets(self, tmp, task_vars):
        """The module with the secret_env of the job in variable secret_env_var added to its
        arguments (those given as secret_env win), as the normal action runs it otherwise."""
        args = dict(self._task.args)
        name = args.pop("secret_env_var")
        job = self._templar.template((task_vars or {}).get(name) or {})
        secrets = job.get("secret_env") if isinstance(job, dict) else None
        if not isinstance(secrets or {}, dict):
            raise AnsibleError(f"secret_env_var {name}: expected its secret_env to be a mapping "
                               f"of names to values, found {type(secrets).__name__}")
        args["secret_env"] = {**(secrets or {}), **(args.get("secret_env") or {})}
        result = super(NormalAction, self).run(tmp, task_vars)
        result = merge_hash(result, self._execute_module(module_args=args, task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
