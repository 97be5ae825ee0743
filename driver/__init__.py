"""torchherd's Python driver: launch and inspect torchherd runs through ansible-runner.

    from driver import launch, launch_async, verify, status, stop, collect, logs, runs, stacks

The driver talks to the collection only through ansible-runner and files (the job spec's
argument_specs.yml, the run directory and its summary.json); it imports nothing from it.
"""

import time

# When this process began running torchherd's code (Python's own start, some 30 ms, is not
# counted): where the CLI's launch timings begin.
STARTED_AT = time.time()

# Imported after the clock is read, which counts their cost (hence noqa: E402).
from driver import api  # noqa: E402, F401 (driver.api.prune, as docs/api.md names it)
from driver.actions import LogStream, collect, logs, runs, stacks, status, stop  # noqa: E402
from driver.handle import RunHandle  # noqa: E402
from driver.launcher import launch, launch_async, verify  # noqa: E402
from driver.logs import LogLine  # noqa: E402
from driver.result import Exit, HostResult, RunInfo, RunResult, UsageError  # noqa: E402
from driver.spec import JobSpecError, load_job  # noqa: E402

__all__ = [
    "Exit", "HostResult", "JobSpecError", "LogLine", "LogStream", "RunHandle", "RunInfo",
    "RunResult", "UsageError", "collect", "launch", "launch_async", "load_job", "logs", "runs",
    "stacks", "status", "stop", "verify",
]
