"""Where the collection, its playbooks and its ansible.cfg live, seen from the driver."""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def collections_path() -> Path:
    """The directory holding ansible_collections/ (a checkout, or TORCHHERD_COLLECTIONS_PATH)."""
    override = os.environ.get("TORCHHERD_COLLECTIONS_PATH")
    return Path(override).resolve() if override else CHECKOUT / "collection"


def collection_dir() -> Path:
    return collections_path() / "ansible_collections" / "torchherd" / "cluster"


def job_spec_file() -> Path:
    return collection_dir() / "roles" / "plan" / "meta" / "argument_specs.yml"


def playbook(name: str) -> Path:
    return collection_dir() / "playbooks" / f"{name}.yml"


def ansible_cfg() -> Path | None:
    cfg = CHECKOUT / "ansible.cfg"
    return cfg if cfg.exists() else None
