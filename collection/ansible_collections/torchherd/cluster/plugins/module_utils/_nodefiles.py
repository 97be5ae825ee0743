# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What node_facts reads of the node's files: the free disk at torchherd's directory and the
hash of the job's code already there."""

from __future__ import annotations

import os

from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import tree_hash


def free_disk(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    stat = os.statvfs(path or "/")
    return stat.f_bavail * stat.f_frsize


def code_on_node(code_dir, files):
    """The hash of the job's `files` in `code_dir`, or None where the directory or any of the
    files is not there (or nothing was asked)."""
    code_dir = os.path.abspath(code_dir) if code_dir else ""
    if not (code_dir and files and os.path.isdir(code_dir)):
        return None
    digest, missing = tree_hash(code_dir, files)
    return None if missing else digest
