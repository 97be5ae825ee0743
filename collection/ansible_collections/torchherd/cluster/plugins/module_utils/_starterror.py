# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Why a job cannot start on a node: raised by the supervisor's checks (_supervisor), ended with
fail_json by the torchrun_job module. Apart from the supervisor, so that the module's other
states (wait, stop, status) do not import the supervisor just to name it."""

from __future__ import annotations


class StartError(Exception):
    """Why the job cannot start here; `result` holds the fields that tell what is there."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result
