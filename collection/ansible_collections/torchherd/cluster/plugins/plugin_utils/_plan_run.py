# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The plan phase's parts beside the plan and the schedule filters (action plan_run): the new
run id, the hash of the job's code, the plan's checks and its records' JSON."""

from __future__ import annotations

import json
import os
import random
import time

from ansible.errors import AnsibleActionFail

from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import (
    MissingLibrary,
    code_hash,
)


def new_run_id():
    """A run id for a job that names none: the UTC time and four random hex digits."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{random.randrange(65535):04x}"


def nice_json(value):
    return json.dumps(value, indent=4, sort_keys=True, separators=(",", ": "), default=str)


def hash_code(job):
    """The job's code as the sync will send it (files, hash, count, left_out); {} for a job-less
    verify, which checks the nodes alone."""
    if not job["script"]:
        return {}
    if not os.path.isdir(job["code_src"]):
        raise AnsibleActionFail(f"code directory {job['code_src']} does not exist")
    try:
        return code_hash(job["code_src"], [], job["excludes"], job["gitignore"], [job["script"]])
    except MissingLibrary as exc:
        raise AnsibleActionFail(str(exc)) from exc


def check_plan(plan, schedule, code, forks):
    """The forks the schedule needs, and the script inside the code the sync sends."""
    job = plan["job"]
    if not schedule["forks_ok"]:
        nodes, needed = len(plan["nodes"]), " and ".join(schedule["forks_needed"])
        raise AnsibleActionFail(
            f"forks: expected at least {nodes} (one per node: {needed} run on every node at "
            f"once), found {forks}; fix: ansible-playbook -f {nodes}, or forks in ansible.cfg")
    if not job["script"] or job["script"] in code["files"]:
        return
    why = (code.get("left_out") or {}).get(job["script"]) or ""
    if why:
        fix = ("change that rule or move the script (a .gitignore's rule: '!' lines in "
               ".torchherdignore at code_src re-include as in git, an ignored directory first; "
               "job.gitignore false reads no .gitignore)")
    else:
        why, fix = "no such file", "give the script's path relative to code_src, or set code_src"
    raise AnsibleActionFail(
        f"job.script: expected {job['script']} inside code_src {job['code_src']} and part of "
        f"the code the sync sends, found {why}; fix: {fix}")
