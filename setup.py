"""The wheel's collection is what `ansible-galaxy collection install` makes of the collection's
tarball: its files (galaxy.yml's build_ignore says which) with MANIFEST.json and FILES.json, so
`ansible-galaxy collection verify` checks the pip-installed copy as it checks any other.
The long description is the README with its relative links made absolute. Everything else
about the build is in pyproject.toml."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
COLLECTION = ROOT / "collection/ansible_collections/torchherd/cluster"
# A Markdown link's target that names no scheme (http:, mailto:) and no anchor of the page.
RELATIVE_LINK = re.compile(r"(\]\()(?![a-z][a-z0-9+.-]*:|#)([^)\s]+)(\))")


def long_description() -> str:
    """The README as a package index shows it: there a relative link resolves against no
    repository, so each one names the file in the project's repository (its Repository URL)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    repository = project["urls"]["Repository"]
    return RELATIVE_LINK.sub(rf"\g<1>{repository}/blob/main/\g<2>\g<3>",
                             (ROOT / "README.md").read_text())


def install_collection(into: Path) -> None:
    """Build the collection's tarball and install it under `into`/ansible_collections, with
    the ansible-core of the build's own Python and none of the user's Ansible configuration."""
    with tempfile.TemporaryDirectory(prefix="torchherd-collection-") as tmp:
        work = Path(tmp)
        (work / "ansible.cfg").write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env.update(ANSIBLE_CONFIG=str(work / "ansible.cfg"), ANSIBLE_HOME=str(work / "home"),
                   ANSIBLE_GALAXY_COLLECTIONS_PATH_WARNING="false")

        def galaxy(*args: object) -> None:
            subprocess.run([sys.executable, "-m", "ansible", "galaxy", "collection",
                            *map(str, args)], cwd=work, env=env, check=True)

        galaxy("build", COLLECTION, "--output-path", work)
        (tarball,) = work.glob("torchherd-cluster-*.tar.gz")
        # --force: a torchherd.cluster already installed where this ansible-galaxy looks (the
        # site-packages of a non-isolated build) would otherwise leave `into` empty.
        galaxy("install", tarball, "-p", into, "--force", "--no-deps", "--offline")


class BuildPyWithCollection(build_py):
    def run(self) -> None:
        super().run()
        # An editable install runs the checkout's collection/ (driver/paths.py).
        if not self.editable_mode:
            install_collection(Path(self.build_lib).resolve())


setup(cmdclass={"build_py": BuildPyWithCollection},
      long_description=long_description(), long_description_content_type="text/markdown")
