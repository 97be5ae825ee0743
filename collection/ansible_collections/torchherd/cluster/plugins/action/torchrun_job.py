# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.torchrun_job: a wait survives one SSH hiccup.

The module runs on the node as usual. With state=waiting, a call that cannot reach the node is
made once more on a fresh connection before the node counts as lost: a busy controller or a
lost packet must not stop a healthy job. Doing it here rather than in a second task keeps the
watch at one task per node; a task that is only there for the rare case still costs the
controller a worker per node on every launch, even where it is skipped.
"""

from __future__ import annotations

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action.normal import ActionModule as NormalAction


class ActionModule(NormalAction):
    """The module as any other (temporary files, async), with a second try for a wait."""

    def run(self, tmp=None, task_vars=None):
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
