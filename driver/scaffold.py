"""``torchherd init``: a directory to start from, laid out like the source tree's.

It holds ``job.yml`` (every key of the job spec, generated from the one definition, so it can
never name a key the driver and the playbooks do not accept), ``inventories/`` (the two nodes
on this machine of the demo, and the commented example of a real cluster) and ``examples/``.
The inventories and examples are the files the README uses, shipped in the wheel beside the
``torchherd`` package (``torchherd/templates/``), so an installed torchherd writes the same.
"""

from __future__ import annotations

import json
import textwrap
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

from driver.arguments import _MARKUP
from driver.result import UsageError
from driver.spec import job_options, sub_keys

JOB_FILE = "job.yml"
# The keys a first launch sets; every other key is written commented out, at its default.
# The inventory's own job (inventories/local.ini) runs the same script: extra vars win over it.
FIRST_JOB: dict[str, Any] = {"script": "allreduce.py", "args": [], "code_src": "examples",
                             "nproc_per_node": 2}
_HEADER = """\
# A torchherd job. From this directory, on two nodes of this machine (needs torch here):
#   torchherd launch -i inventories/local.ini -j job.yml
# and on your machines, once they are listed in inventories/cluster.ini:
#   torchherd verify -i inventories/cluster.ini -j job.yml    # checks every node, starts nothing
#   torchherd launch -i inventories/cluster.ini -j job.yml
# With Ansible alone: ansible-playbook torchherd.cluster.launch -i inventories/local.ini -e @job.yml
# Flags of `torchherd launch` override these keys (`torchherd launch --help` lists them).
# Relative paths (code_src, runs_dir) are relative to the directory torchherd runs in.
# Values are YAML; a key commented out (#key: value) shows its default.
"""


def _comment(text: str) -> list[str]:
    plain = _MARKUP.sub(r"\1", text).replace("torchherd_job.", "")
    return textwrap.wrap(plain, width=96, initial_indent="  # ", subsequent_indent="  # ")


def job_template() -> str:
    """The text of ``job.yml``: the keys of FIRST_JOB set, the others commented out."""
    lines = [_HEADER.rstrip("\n"), "torchherd_job:"]
    for key, option in job_options().items():
        description = option.get("description", "")
        if isinstance(description, list):
            description = " ".join(description)
        if option.get("choices"):
            description += f" One of: {', '.join(map(str, option['choices']))}."
        lines.extend(_comment(description))
        # JSON is YAML: lists, mappings, booleans and strings come out as a job file spells them.
        if key in FIRST_JOB:
            lines.append(f"  {key}: {json.dumps(FIRST_JOB[key])}")
        else:
            lines.append(f"  #{key}: {json.dumps(option.get('default'))}")
        if option.get("options"):  # a mapping: its own keys, one comment each
            lines.extend(line for described in sub_keys(key)
                         for line in textwrap.wrap(described, width=96, initial_indent="  #   ",
                                                   subsequent_indent="  #     "))
    return "\n".join(lines) + "\n"


def _templates() -> dict[str, bytes]:
    """Relative path in the new directory -> the shipped file's content (examples and
    inventories), read while as_file's path exists (a zipped install's is temporary)."""
    root = files("torchherd") / "templates"
    found = {}
    for folder, patterns in (("inventories", ("*.ini",)), ("examples", ("*.py", "*.sbatch"))):
        with as_file(root / folder) as directory:
            for pattern in patterns:
                found.update({f"{folder}/{p.name}": p.read_bytes()
                              for p in Path(directory).glob(pattern)})
    return found


def init(target: str | Path, force: bool = False) -> list[Path]:
    """Write job.yml, inventories/ and examples/ into ``target`` (created if missing); refuse
    to overwrite a file there unless ``force``. Returns the files written."""
    target = Path(target).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"init {target}: expected a directory, found a file; fix: give a "
                         f"directory (a new one is created)")
    sources = _templates()
    planned = [JOB_FILE, *sorted(sources)]
    existing = [name for name in planned if (target / name).exists()]
    if existing and not force:
        raise UsageError(f"init {target}: expected none of the files it writes there, found "
                         f"{', '.join(existing)}; fix: pass --force to overwrite them, or "
                         f"choose another directory")
    written = []
    for name in planned:
        path = target / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if name == JOB_FILE:
                path.write_text(job_template(), encoding="utf-8")
            else:
                path.write_bytes(sources[name])
        except OSError as exc:
            raise UsageError(f"init {target}: expected a directory it can write {name} into, "
                             f"found: {exc.strerror} ({exc.filename}); fix: choose a directory "
                             f"of yours") from None
        written.append(path)
    return written
