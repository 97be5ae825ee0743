# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action for torchherd.cluster.plan_run: the plan phase's work on the controller, in one task.

The plan (filter plan), the hash of the job's code (code_hash's), the schedule (filter
schedule), their two checks and the claim of the run directory (run_record's) were five tasks
of the plan role, each a forked worker on the controller at the start of every launch. Here
they are one, in this process, from the same functions; the role hands the answers on with one
set_fact.

The job comes from the variable O(job_var) names, templated here: a task argument holding it
would show its secret values to every callback (see the torchrun_job action).
"""

from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail, AnsibleFilterError
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.filter.plan import plan as make_plan
from ansible_collections.torchherd.cluster.plugins.filter.schedule import schedule as make_schedule
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan_run import (
    check_plan,
    hash_code,
    new_run_id,
    nice_json,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._prior import find, job_key, point
from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_record import record

_ARGS = {
    "job_var": {"type": "str", "default": "torchherd_job"},
    "playbook": {"type": "str", "default": "launch"},
    "exclude": {"type": "dict", "default": {}},
    "limit": {"type": "str", "default": ""},
    "limit_hosts": {"type": "list", "elements": "str"},
    "restart": {"type": "int", "default": 0},
    "launched_at": {"type": "float"},
    "forks": {"type": "int", "required": True},
    "progress_every": {"type": "raw", "default": 0},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        started = time.time()  # the plan phase's start (the summary's timings)
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validate_argument_spec(argument_spec=_ARGS)[1]
        job = self._templar.template(task_vars.get(args["job_var"]) or {})
        try:
            plan = make_plan(job, task_vars.get("groups") or {}, task_vars.get("hostvars") or {},
                             run_id=new_run_id(), playbook=args["playbook"],
                             exclude=args["exclude"], limit=args["limit"],
                             limit_hosts=args["limit_hosts"])
        except AnsibleFilterError as exc:  # every problem of the job, in the filter's words
            raise AnsibleActionFail(exc.message) from exc
        plan.update(started_at=started, restart=args["restart"],
                    launched_at=args["launched_at"])
        # The controller's directories as absolute paths: every later phase, and status, stop
        # and collect of the run, read them from plan.json, whatever their working directory.
        raw = job if isinstance(job, dict) else {}
        for key, default in (("runs_dir", "runs"), ("code_src", ".")):
            plan["job"][key] = os.path.realpath(os.path.expanduser(raw.get(key) or default))
        code = hash_code(plan["job"])
        # The last launch of the same job on the same nodes, whose preflight passed: a relaunch's
        # starts may come with its facts calls (the schedule decides, start.with_facts).
        key = job_key(plan, code.get("hash"))
        launching = args["playbook"] == "launch" and not self._task.check_mode
        prior = find(plan["job"]["runs_dir"], key, [n["host"] for n in plan["nodes"]]) \
            if launching else None
        schedule = make_schedule(plan, forks=args["forks"], playbook=args["playbook"],
                                 progress_every=args["progress_every"], prior=prior)
        check_plan(plan, schedule, code, args["forks"])
        recorded = dict(plan, code_hash=code.get("hash"), code_files=code.get("count") or 0)
        run_dir, written, _now = record(
            os.path.join(plan["job"]["runs_dir"], plan["run_id"]),
            {"plan.json": nice_json(recorded), "schedule.json": nice_json(schedule)},
            claim=True, mark="plan", check_mode=self._task.check_mode)
        if launching:
            point(plan["job"]["runs_dir"], key, plan["run_id"])
        result.update(changed=True, plan=plan, schedule=schedule, code=code, run_dir=run_dir,
                      files=written,
                      prior=prior if schedule["start"]["with_facts"] else None)
        return result
