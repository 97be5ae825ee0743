"""The wheel's collection is what `ansible-galaxy collection install` makes of the collection's
tarball: its files (galaxy.yml's build_ignore says which) with MANIFEST.json and FILES.json, so
`ansible-galaxy collection verify` checks the pip-installed copy as it checks any other.
Everything else about the build is in pyproject.toml."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

COLLECTION = Path(__file__).resolve().parent / "collection/ansible_collections/torchherd/cluster"


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


setup(cmdclass={"build_py": BuildPyWithCollection})
