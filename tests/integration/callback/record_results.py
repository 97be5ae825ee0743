"""A result-recording callback as ARA or AWX would be, for tests/integration/test_secrets.py.

It keeps what such a callback can store at any verbosity, one JSON document a line: every
task's arguments as written and every runner result, appended to the file named by
TORCHHERD_TEST_RECORD; and each result's task arguments as templated for the run, appended to
TORCHHERD_TEST_RECORD_ARGS (ansible-core keeps those in clear also under no_log).
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: record_results
short_description: Append every task's arguments and every result to files, as JSON lines
description:
  - Test helper of the torchherd project; enable it with ANSIBLE_CALLBACKS_ENABLED.
type: notification
options: {}
"""


def _append(variable, data):
    with open(os.environ[variable], "a", encoding="utf-8") as handle:
        handle.write(json.dumps(data, default=str) + "\n")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "record_results"
    CALLBACK_NEEDS_ENABLED = True

    def _result(self, kind, result):
        _append("TORCHHERD_TEST_RECORD", {"kind": kind, "host": result.host.name,
                                          "task": result.task_name, "result": result.result})
        _append("TORCHHERD_TEST_RECORD_ARGS", {"kind": kind, "host": result.host.name,
                                               "task": result.task_name,
                                               "args": result.task_fields.get("args")})

    def v2_playbook_on_task_start(self, task, is_conditional):
        _append("TORCHHERD_TEST_RECORD", {"kind": "task_start", "task": task.get_name(),
                                          "args": task.args})

    def v2_playbook_on_handler_task_start(self, task):
        _append("TORCHHERD_TEST_RECORD", {"kind": "handler_task_start", "task": task.get_name(),
                                          "args": task.args})


# Every runner result, under its kind: "runner_on_ok" is what v2_runner_on_ok gets.
RESULT_KINDS = (
    "runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable",
    "runner_on_async_ok", "runner_on_async_failed", "runner_item_on_ok",
    "runner_item_on_failed", "runner_item_on_skipped", "runner_retry",
)


def _recorder(kind):
    def record(self, result, *_args, **_kwargs):  # v2_runner_on_failed also gets ignore_errors
        self._result(kind, result)

    record.__name__ = f"v2_{kind}"
    return record


for _kind in RESULT_KINDS:
    setattr(CallbackModule, f"v2_{_kind}", _recorder(_kind))
