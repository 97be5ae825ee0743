# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Writing a file that others read while it changes: they find the old one or the whole new
one, never a part of it."""

from __future__ import annotations

import os
import threading


def write_atomic(path, text, mode=None):
    """Writes `text` to a file of its own beside `path`, then renames it over `path`. The
    file is per process and thread: the supervisor's threads (the gang's stop, its own end)
    write the same files. `mode`: the file's permission bits, set before it is in place (None:
    what the umask leaves)."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
