# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.torchrun_job: secrets that no task argument holds, and a wait
that survives one SSH hiccup.

The module runs on the node as usual, with its option `arguments` (the start's arguments as
filter start_args computes them, handed on whole) spread into its other arguments. With
secret_env_var, the secret values of the job that
variable holds join the module's arguments here, at run time: callbacks see every task's
arguments once templated (no_log does not hide them from a callback that records results),
so the start task names the variable and holds no value.

With state=waiting, a call that cannot reach the node is made once more on a fresh connection
before the node counts as lost: a busy controller or a lost packet must not stop a healthy job.
Doing it here rather than in a second task keeps the watch at one task per node; a task that
is only there for the rare case still costs the controller a worker per node on every launch,
even where it is skipped.

With a wait's O(hang), the action is the hang watch's controller side (HangWatch below): it
tells the node the quiet spell it knows of, keeps what every node said in the run directory
and declares the job hung once all are quiet.

Every answer gets C(received_at), the controller's time when it came back: with the node's own
C(checked_at) it gives how far that node's clock is off, so that times of different nodes can
be compared (summary.json's root cause, timings) without the clocks agreeing.
"""

from __future__ import annotations

import json
import os
import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.vars import merge_hash

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.plugin_utils._node_args import (
    job_secrets,
    spread_arguments,
)


class HangWatch:
    """The job's hang watch across nodes, in files of the run directory on the controller (every
    node's wait runs in a worker of its own): <dir>/<host>.json holds what that node last said
    about its progress, <dir>/hung.json the hang once declared.

    A node's wait returns when the node goes quiet (or active again, see the module's hang
    option); the job is hung once every node is quiet (or ended) and the newest progress of
    any node is hang timeout seconds old. The first wait to see that declares it (an exclusive
    create): its rescue collects the stacks and stops the job as the user chose."""

    def __init__(self, directory, hosts, timeout, host):
        self.dir, self.hosts, self.timeout, self.host = directory, list(hosts), timeout, host
        self.hung_file = os.path.join(directory, "hung.json")

    def _read(self, host):
        try:
            with open(os.path.join(self.dir, f"{host}.json"), encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {}

    def quiet_since(self):
        """The node's quiet spell the controller knows of (its clock), 0 when none."""
        return float(self._read(self.host).get("quiet_since") or 0)

    def judge(self, result):
        activity = result.get("activity")
        if not isinstance(activity, dict):
            return result  # unreachable, or the module failed: the watch decides on it
        now = time.time()
        ended = result.get("job_state") != "running"
        last = activity.get("last")
        # The node's time of its last progress on the controller's clock.
        offset = now - float(result.get("checked_at") or now)
        record = {"quiet": bool(activity.get("quiet")) or ended, "ended": ended, "at": now,
                  "quiet_since": last if activity.get("quiet") else 0,
                  "last": None if last is None else last + offset}
        os.makedirs(self.dir, exist_ok=True)
        # Read by its host's name alone (_read): the file in the making is never taken.
        write_atomic(os.path.join(self.dir, f"{self.host}.json"), json.dumps(record))
        state = "quiet" if record["quiet"] else "active"
        if activity.get("hung") or os.path.exists(self.hung_file):
            state = "hung"
        elif not ended and record["quiet"] and self._everyone_quiet(now):
            state = "hung"
            result["hang_declared"] = self._declare(now)
        result["hang_state"] = state
        return result

    def _everyone_quiet(self, now):
        records = [self._read(h) for h in self.hosts]
        if not all(r.get("quiet") for r in records):
            return False
        newest = max((r["last"] for r in records if r.get("last") is not None), default=None)
        return newest is None or now - newest >= self.timeout

    def _declare(self, now):
        records = {h: self._read(h) for h in self.hosts}
        newest = max((r["last"] for r in records.values() if r.get("last") is not None),
                     default=None)
        try:
            handle = os.open(self.hung_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False  # another node's wait declared it a moment before
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"declared_at": now, "declared_by": self.host, "timeout": self.timeout,
                       "last_progress": newest,
                       "quiet_for": None if newest is None else round(now - newest, 1),
                       "nodes": records}, out)
        return True


class ActionModule(NormalAction):
    """The module as any other (temporary files, async), with a second try for a wait."""

    def run(self, tmp=None, task_vars=None):
        # The option `arguments` (the start's, from filter start_args) spread into the others,
        # for every path below.
        original = self._task.args
        if "arguments" in original:
            self._task.args = spread_arguments(original)
        try:
            result = self._run(tmp, task_vars)
        finally:
            self._task.args = original
        if isinstance(result, dict) and not result.get("unreachable"):
            result["received_at"] = time.time()
        return result

    def _run(self, tmp, task_vars):
        if self._task.args.get("secret_env_var"):
            return self._run_with_secrets(tmp, task_vars)
        if self._task.args.get("state") != "waiting":
            return super().run(tmp, task_vars)
        hang = self._task.args.get("hang")
        if not hang:
            return self._wait(tmp, task_vars)
        watch = HangWatch(hang["dir"], hang["hosts"], float(hang["timeout"]),
                          (task_vars or {}).get("inventory_hostname"))
        # The module gets what the node needs; the watch's own files stay on the controller.
        original = self._task.args
        self._task.args = dict(original, hang={"timeout": watch.timeout,
                                               "quiet_since": watch.quiet_since()})
        try:
            result = self._wait(tmp, task_vars)
        finally:
            self._task.args = original
        return watch.judge(result)

    def _wait(self, tmp, task_vars):
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
        secrets = job_secrets(self._templar, task_vars, args.pop("secret_env_var"))
        args["secret_env"] = {**secrets, **(args.get("secret_env") or {})}
        result = super(NormalAction, self).run(tmp, task_vars)
        result = merge_hash(result, self._execute_module(module_args=args, task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
