# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""One content hash for a code tree, computed the same way on the controller and the nodes."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import traceback

# Read in every directory of the tree, as git does.
GITIGNORE = ".gitignore"
# Read at the root only, after the .gitignore files: its rules win (what git tracks but the
# nodes need not get, or a '!' line that sends what git ignores).
TORCHHERDIGNORE = ".torchherdignore"


class MissingLibrary(Exception):
    """An ignore file was found but pathspec, which reads it, is not installed here;
    ``import_error`` holds the failed import's traceback."""

    def __init__(self, msg, import_error=None):
        super().__init__(msg)
        self.import_error = import_error


def gitignore_spec():
    """pathspec's GitIgnoreSpec, imported where an ignore file is read. Only listing a tree that
    holds ignore files needs it: the controller does that (the plan), while the nodes import this
    file to hash a given list and need nothing beyond Python; where pathspec is installed on a
    node, importing it there would cost every preflight 30-40 ms for nothing. Raises
    MissingLibrary (with the import's traceback) where it is not installed."""
    try:
        from pathspec import GitIgnoreSpec
    except ImportError as exc:
        raise MissingLibrary("", traceback.format_exc()) from exc
    return GitIgnoreSpec


def excluded(relpath, patterns):
    """rsync-like: a pattern without '/' matches any path component; one with '/' the path.
    Returns the first matching pattern, or None."""
    parts = relpath.split("/")
    for pattern in patterns:
        if "/" in pattern.strip("/"):
            if fnmatch.fnmatch(relpath, pattern.lstrip("/")):
                return pattern
        elif any(fnmatch.fnmatch(part, pattern.strip("/")) for part in parts):
            return pattern
    return None


class _IgnoreFile:
    """One ignore file: its rules apply to paths below its directory (base, '' or 'dir/')."""

    def __init__(self, root, base, name):
        self.source = base + name
        path = os.path.join(root, self.source)
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
        # pathspec drops empty lines; numbering them here keeps a rule's line number.
        self.lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line]
        self.base = base
        self.spec = gitignore_spec().from_lines([line for _number, line in self.lines])

    def verdict(self, rel, is_dir):
        """(ignored, rule) from the file's last matching rule, or None where no rule matches."""
        if not rel.startswith(self.base):
            return None
        sub = rel[len(self.base):] + ("/" if is_dir else "")
        check = self.spec.check_file(sub)
        if check.include is None:
            return None
        number, line = self.lines[check.index]
        return check.include, f"{self.source} line {number} ({line!r})"


class Rules:
    """What the sync leaves out of a code tree: the .git directory, the job's excludes
    (rsync-like), and, with gitignore, every .gitignore in the tree with git's semantics (a
    deeper file's rules win), then .torchherdignore at the root."""

    def __init__(self, root, excludes, gitignore=True):
        self.root = root
        self.excludes = excludes
        self.gitignore = gitignore
        self._files = {}
        self._top = self._load("", TORCHHERDIGNORE)

    def _load(self, base, name):
        if not os.path.isfile(os.path.join(self.root, base, name)):
            return []
        try:
            gitignore_spec()
        except MissingLibrary as exc:
            raise MissingLibrary(
                f"{base}{name} under {self.root}: reading an ignore file needs the Python "
                "library pathspec, which is not installed here; fix: install pathspec, or list "
                "the tree on the controller", exc.import_error) from None
        return [_IgnoreFile(self.root, base, name)]

    def _chain(self, rel_dir):
        """The ignore files that apply inside directory rel_dir ('' or 'a/b/'), shallow first;
        walking the tree top-down reads each file once."""
        if rel_dir not in self._files:
            parent = rel_dir[:rel_dir.rstrip("/").rfind("/") + 1] if rel_dir else None
            chain = [] if parent is None else self._chain(parent)[:]
            if self.gitignore:
                chain += self._load(rel_dir, GITIGNORE)
            self._files[rel_dir] = chain
        return self._files[rel_dir]

    def reason(self, rel, is_dir):
        """Why the sync leaves out rel (relative to the root), or None where it is sent. The
        parent directories must have been let through: inside an ignored directory nothing is
        looked at, as in git."""
        if rel.rsplit("/", 1)[-1] == ".git":
            return "torchherd itself (a .git is never sent)"
        pattern = excluded(rel, self.excludes)
        if pattern:
            return f"the job's excludes ({pattern!r})"
        rel_dir = rel[:rel.rfind("/") + 1]
        verdict = None
        for rules in self._chain(rel_dir) + self._top:
            verdict = rules.verdict(rel, is_dir) or verdict
        if verdict and verdict[0]:
            return verdict[1]
        return None

    def explain(self, rel, is_dir=None):
        """Why a path is not part of the manifest: the first of it and its parent directories
        that is left out, and the rule; None where nothing leaves it out. ``is_dir`` says
        whether rel is a directory, for one that need not exist yet (None: as the disk says)."""
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            path = "/".join(parts[:depth])
            full = os.path.join(self.root, path)
            if depth < len(parts):
                here_dir = True
            elif is_dir is not None:
                here_dir = is_dir
            else:
                here_dir = os.path.isdir(full) and not os.path.islink(full)
            why = self.reason(path, here_dir)
            if why:
                return f"{path}{'/' if here_dir else ''} is left out by {why}"
        return None


def manifest(rules):
    """Files (and symlinks) under rules.root, relative, sorted, with what the rules leave out
    pruned. Symlinks to directories are entries, not descended, and match as files, as in git."""
    found = []
    for dirpath, dirnames, filenames in os.walk(rules.root):
        rel_dir = os.path.relpath(dirpath, rules.root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = sorted(d for d in dirnames
                             if d not in links and not rules.reason(rel_dir + d, True))
        found += [rel_dir + f for f in filenames + links if not rules.reason(rel_dir + f, False)]
    return sorted(found)


def code_hash(root, files, excludes, gitignore, explain):
    """The code_hash result. Without files, the manifest of root: its files, their count and
    bytes, and for each path of explain that it lacks, why (left_out)."""
    result = {"changed": False}
    if not files:
        rules = Rules(root, excludes, gitignore)
        files = manifest(rules)
        whys = {rel: rules.explain(rel.strip("/")) for rel in explain}
        result.update(bytes=sum(os.lstat(os.path.join(root, f)).st_size for f in files),
                      left_out={rel: why for rel, why in whys.items() if why})
    result["hash"], result["missing"] = tree_hash(root, files)
    result.update(count=len(files), files=files)
    return result


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
