# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Secret values out of whatever is set as a fact, shown or written (the plan among them)."""

from __future__ import annotations

import re

DOCUMENTATION = r"""
name: redact
author: torchherd developers
version_added: 0.1.0
short_description: Hide the values of every secret_env in a plan or a job
description:
  - Returns a copy of the input in which every C(secret_env) dictionary, at any depth, keeps its
    names but has each value replaced by C(********), and every C(index_url) (a package
    index, as in a job's C(venv)) has the credentials of its URL replaced the same way.
  - Everything else comes back as it is, so the result is fit for facts, files and output.
    The filter C(torchherd.cluster.plan) applies it to the job it returns, so the plan (a fact,
    C(plan.json), C(summary.json)) never holds a secret value.
positional: _input
options:
  _input:
    description: The plan from C(torchherd.cluster.plan), a job, or any data that holds them.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Record the plan without its secrets
  ansible.builtin.copy:
    dest: runs/demo-1/plan.json
    content: "{{ torchherd_plan | torchherd.cluster.redact | to_nice_json }}"
    mode: "0644"
"""

RETURN = r"""
_value:
  description: The input with every C(secret_env) value replaced by C(********).
  type: raw
"""


_USERINFO = re.compile(r"//[^/@\s]*@")


def _value(key, value):
    if key == "secret_env" and isinstance(value, dict):
        return {name: "********" for name in value}
    if key == "index_url" and isinstance(value, str):
        return _USERINFO.sub("//********@", value)
    return redact(value)


def redact(value):
    """The plan (or job) with every secret_env value replaced, fit for files and output."""
    if isinstance(value, dict):
        return {k: _value(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


class FilterModule:
    """torchherd redaction filter."""

    def filters(self):
        return {"redact": redact}
