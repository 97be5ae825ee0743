"""torchherd's Python driver: launch and inspect torchherd runs through ansible-runner.

The driver talks to the collection only through ansible-runner and files (the job spec's
argument_specs.yml, the run directory and its summary.json); it imports nothing from it.
"""

from driver.api import RunResult, launch, verify
from driver.spec import JobSpecError, load_job

__all__ = ["JobSpecError", "RunResult", "launch", "load_job", "verify"]
