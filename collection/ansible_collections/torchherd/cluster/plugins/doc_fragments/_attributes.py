# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the attributes of torchherd's modules mean; each module says how far it supports them."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check mode and report what would change without changing it.
  diff_mode:
    description: Returns what changed (or would change in check mode) in diff mode.
  idempotent:
    description: Run again with the same arguments on an unchanged node, it changes nothing.
"""
