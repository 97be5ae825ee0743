# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The supervisor's own lines in the node log."""

from __future__ import annotations

import os


def say(text):
    """A line of the supervisor's own in the node log (its stdout by then), written to the file
    descriptor itself: sys.stdout may be anything the forking process had (a test's capture)."""
    os.write(1, f"torchherd: {text}\n".encode(errors="replace"))
