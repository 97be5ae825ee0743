"""torchherd's Python driver: launch and inspect torchherd runs through ansible-runner.

    from driver import launch, launch_async, verify, status, stop, collect, logs, runs, stacks

The driver talks to the collection only through ansible-runner and files (the job spec's
argument_specs.yml, the run directory and its summary.json); it imports nothing from it.
"""

import time

# When this process began running torchherd's code (Python's own start, some 30 ms, is not
# counted): where the CLI's launch timings begin.
STARTED_AT = time.time()

from driver.api import (  # noqa: E402 (after the clock is read)
    Exit,
    HostResult,
    LogLine,
    LogStream,
    RunHandle,
    RunInfo,
    RunResult,
    UsageError,
    collect,
    launch,
    launch_async,
    logs,
    runs,
    stacks,
    status,
    stop,
    verify,
)
from driver.spec import JobSpecError, load_job  # noqa: E402

__all__ = [
    "Exit", "HostResult", "JobSpecError", "LogLine", "LogStream", "RunHandle", "RunInfo",
    "RunResult", "UsageError", "collect", "launch", "launch_async", "load_job", "logs", "runs",
    "stacks", "status", "stop", "verify",
]
