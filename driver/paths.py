"""Where the driver's collection lives, and which one ansible-playbook will use.

The driver runs the collection's playbooks by name (``torchherd.cluster.launch``), so Ansible
resolves the collection the way it resolves any other, in this order:

1. ``TORCHHERD_COLLECTIONS_PATH``, when set: put in front of Ansible's collections path.
2. Ansible's own collections path (``ANSIBLE_COLLECTIONS_PATH``, or ``collections_path`` in the
   user's ansible.cfg; by default ``~/.ansible/collections`` and
   ``/usr/share/ansible/collections``): a torchherd.cluster installed with ``ansible-galaxy``.
3. The copy shipped beside the driver: in site-packages for an installed wheel (ansible-core
   looks there after its collections path), or ``collection/`` of a source checkout (which the
   driver puts on the collections path itself).

The plan refuses a collection whose version is not the driver's, naming its path.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

_PACKAGE_PARENT = Path(__file__).resolve().parent.parent
# A source checkout (also an editable install): the collection sits in collection/.
CHECKOUT = _PACKAGE_PARENT
_CHECKOUT_COLLECTIONS = _PACKAGE_PARENT / "collection"
_RELATIVE = Path("ansible_collections") / "torchherd" / "cluster"
# Ansible's default COLLECTIONS_PATHS, used when the checkout's copy must be added to it.
_ANSIBLE_DEFAULT_COLLECTIONS = "~/.ansible/collections:/usr/share/ansible/collections"


def is_checkout() -> bool:
    return (_CHECKOUT_COLLECTIONS / _RELATIVE / "galaxy.yml").is_file()


def shipped_collections_path() -> Path:
    """The directory holding ansible_collections/ that came with this driver."""
    if os.environ.get("TORCHHERD_COLLECTIONS_PATH"):
        return Path(os.environ["TORCHHERD_COLLECTIONS_PATH"]).expanduser().resolve()
    return _CHECKOUT_COLLECTIONS if is_checkout() else _PACKAGE_PARENT


def collection_dir() -> Path:
    return shipped_collections_path() / _RELATIVE


def job_spec_file() -> Path:
    return collection_dir() / "roles" / "plan" / "meta" / "argument_specs.yml"


def playbook(name: str) -> str:
    """The playbook's name as ansible-playbook takes it: Ansible finds the collection."""
    return f"torchherd.cluster.{name}"


def collections_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """ANSIBLE_COLLECTIONS_PATH for a run, or nothing where Ansible finds the copy itself.

    An installed wheel needs nothing: ansible-core scans site-packages after its configured
    collections path. TORCHHERD_COLLECTIONS_PATH and a checkout's collection/ are put on the
    path: the first in front of it (an explicit choice), the second behind it.
    """
    environ = os.environ if environ is None else environ
    configured = environ.get("ANSIBLE_COLLECTIONS_PATH", "")
    override = environ.get("TORCHHERD_COLLECTIONS_PATH", "")
    if override:
        return {"ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(
            p for p in (str(Path(override).expanduser().resolve()), configured) if p)}
    if is_checkout():
        return {"ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(
            (configured or _ANSIBLE_DEFAULT_COLLECTIONS, str(_CHECKOUT_COLLECTIONS)))}
    return {}


def driver_version() -> str | None:
    """The installed distribution's version; None when run from a checkout never installed."""
    try:
        return importlib.metadata.version("torchherd")
    except importlib.metadata.PackageNotFoundError:
        return None
