"""torchherd: verified multi-node PyTorch launches from an Ansible inventory.

    import torchherd

    run = torchherd.launch({"script": "allreduce.py", "code_src": "examples",
                            "nproc_per_node": 2}, "inventories/local.ini")
    print(run.state, run.exit_code.name, run.reason)

The public Python API, described name by name in docs/api.md of the source tree. The
implementation lives in the ``driver`` package: ``python -m torchherd``, ``python -m driver``
and the ``torchherd`` command are the same program.
"""

import driver
from driver import *  # noqa: F403 (the driver's public API is this package's)
from driver.api import act_async, verify_async
from driver.paths import driver_version

# The installed distribution's version; a checkout that was never installed has none.
__version__ = driver_version() or "0+unknown"

__all__ = ["act_async", "verify_async"]
__all__ += driver.__all__
