# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Reading the files the collect phase fetched: what is there, and nothing where a file is
missing or unreadable (a node may not have written it)."""

from __future__ import annotations

import json
import os

# The controller's record of when each phase of the launch ended (run_record's mark), in the
# run directory beside plan.json.
MARKS = "marks.json"


def read_tail(path, limit=1 << 20):
    """The last ``limit`` bytes of a file as text, or "" where it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def read_json(path):
    """A JSON object from a file, or None."""
    text = read_tail(path)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
