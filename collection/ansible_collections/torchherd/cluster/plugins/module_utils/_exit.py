# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A module's interpreter ends without its last garbage collection."""

from __future__ import annotations

import atexit
import gc


def skip_last_collection():
    """Leave the module's objects to its process's end: at the interpreter's exit, after the
    module wrote its result, no last garbage collection goes over every object the module and
    Ansible's module_utils made. A task's result reaches Ansible only when the module's process
    has ended, so that collection (about 15 ms of every call, measured on node_runs) was on the
    way of every task on every node. Each module's main calls it first; once per process."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
