# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""One content hash for a code tree, computed the same way on the controller and the nodes."""

from __future__ import annotations

import fnmatch
import hashlib
import os


def excluded(relpath, patterns):
    """rsync-like: a pattern without '/' matches any path component; one with '/' the path."""
    parts = relpath.split("/")
    for pattern in patterns:
        if "/" in pattern.strip("/"):
            if fnmatch.fnmatch(relpath, pattern.lstrip("/")):
                return True
        elif any(fnmatch.fnmatch(part, pattern.strip("/")) for part in parts):
            return True
    return False


def manifest(root, patterns):
    """Files (and symlinks) under root, relative, sorted, with excluded paths pruned."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames
                             if not excluded(rel_dir + d, patterns)
                             and not os.path.islink(os.path.join(dirpath, d)))
        found += [rel_dir + f for f in filenames if not excluded(rel_dir + f, patterns)]
        found += [rel_dir + d for d in os.listdir(dirpath)
                  if os.path.islink(os.path.join(dirpath, d)) and os.path.isdir(os.path.join(dirpath, d))
                  and not excluded(rel_dir + d, patterns)]
    return sorted(found)


def tree_hash(root, files):
    """sha256 over (path, executable bit, content digest) of each file; returns (hash, missing
    files). The executable bit counts because rsync carries it and a script may need it."""
    outer = hashlib.sha256()
    missing = []
    for rel in sorted(files):
        path = os.path.join(root, rel)
        outer.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        if os.path.islink(path):
            outer.update(b"link:" + os.readlink(path).encode("utf-8", "surrogateescape"))
        elif os.path.isfile(path):
            inner = hashlib.sha256()
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    inner.update(chunk)
            outer.update(b"x" if os.stat(path).st_mode & 0o100 else b"-")
            outer.update(inner.digest())
        else:
            missing.append(rel)
            outer.update(b"missing")
        outer.update(b"\n")
    return outer.hexdigest(), missing
