"""Wheels for tests that install packages on the nodes without outside network: a small pure
Python wheel written here, and uv's wheel fetched once into the testbed's state directory."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.cluster.testbed import state_dir

# The uv the nodes install when they have none (pinned: the tests' runs stay comparable).
UV_VERSION = "0.13.9"


def pure_wheel(into: Path, name: str, version: str, value: str) -> Path:
    """A wheel of package ``name`` whose module holds VALUE = ``value``."""
    files = {f"{name}/__init__.py": f"VALUE = {value!r}\n".encode(),
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: torchherd-tests\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n"}
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    into.mkdir(parents=True, exist_ok=True)
    wheel = into / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def uv_wheel() -> Path:
    """uv's wheel for this machine, fetched once from the package registry pip is set up for."""
    cache = state_dir() / f"uv-{UV_VERSION}"
    found = sorted(cache.glob("uv-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary", ":all:", "--dest", str(cache), f"uv=={UV_VERSION}"],
                       check=True)
        found = sorted(cache.glob("uv-*.whl"))
    return found[0]


def uv_binary() -> Path:
    """uv itself, taken out of its wheel, for the controller's side of a test (uv lock)."""
    wheel = uv_wheel()
    binary = wheel.parent / "bin" / "uv"
    if not binary.exists():
        binary.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(f"uv-{UV_VERSION}.data/scripts/uv")
        partial = binary.with_suffix(".partial")
        partial.write_bytes(data)
        partial.chmod(0o755)
        partial.rename(binary)
    return binary


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
