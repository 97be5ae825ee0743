#!/usr/bin/env python3
"""Write torchherd's one version (the file VERSION) where the collection needs it.

The wheel reads VERSION itself (pyproject.toml: [tool.setuptools.dynamic]), and `torchherd
--version` reads the installed wheel. The collection has its own copies, which Ansible reads:
galaxy.yml's `version` (ansible-galaxy) and the plan's `torchherd_collection_version` (the plan
refuses a collection whose version is not the driver's). This script writes both from VERSION,
changing only those two lines.

    scripts/set-version.py VERSION      # write VERSION's version into the collection
    scripts/set-version.py 0.2.0        # write 0.2.0 into VERSION, then into the collection
    scripts/set-version.py --check      # exit 1, naming the files, where a copy differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTION = Path("collection/ansible_collections/torchherd/cluster")
# The copies: file (relative to the checkout) and the one line that holds the version.
COPIES = {
    COLLECTION / "galaxy.yml": re.compile(r"^(version:[ \t]*)(\S+)([ \t]*)$", re.M),
    COLLECTION / "roles/plan/vars/main.yml": re.compile(
        r"^(torchherd_collection_version:[ \t]*)(\S+)([ \t]*)$", re.M),
}
# A PEP 440 / semantic version, as both galaxy.yml and a wheel accept it: 1.2.3, 1.2.3rc1 ...
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.-]?[0-9A-Za-z.+-]+)?$")


def read_version(root: Path = ROOT) -> str:
    version = (root / "VERSION").read_text(encoding="utf-8").strip()
    if not _VERSION.match(version):
        raise ValueError(f"{root / 'VERSION'}: not a version: {version!r}")
    return version


def copies(root: Path = ROOT) -> dict[Path, str]:
    """Each copy's version, by path relative to the checkout."""
    found = {}
    for path, line in COPIES.items():
        matches = line.findall((root / path).read_text(encoding="utf-8"))
        if len(matches) != 1:
            raise ValueError(f"{root / path}: expected one version line, found {len(matches)}")
        found[path] = matches[0][1]
    return found


def write(root: Path = ROOT, version: str | None = None) -> list[Path]:
    """Write `version` (default: VERSION's) into VERSION and every copy; the files changed."""
    changed = []
    if version is not None:
        if not _VERSION.match(version):
            raise ValueError(f"not a version: {version!r}")
        if read_version(root) != version:
            (root / "VERSION").write_text(version + "\n", encoding="utf-8")
            changed.append(Path("VERSION"))
    version = read_version(root)
    copies(root)  # refuses a file whose version line is missing or doubled, before writing
    for path, line in COPIES.items():
        text = (root / path).read_text(encoding="utf-8")
        new = line.sub(lambda m: m.group(1) + version + m.group(3), text)
        if new != text:
            (root / path).write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", nargs="?", default="VERSION",
                        help="VERSION (the default: use the file's version) or a new version")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 where a copy differs from VERSION")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        version = read_version(args.root)
        wrong = {p: v for p, v in copies(args.root).items() if v != version}
        for path, found in wrong.items():
            print(f"{path}: {found}, VERSION: {version}", file=sys.stderr)
        return 1 if wrong else 0
    changed = write(args.root, None if args.version == "VERSION" else args.version)
    for path in changed:
        print(f"wrote {read_version(args.root)} into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
