# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the attributes of torchherd's modules mean, and the variants several modules share.

Private to the collection (leading underscore): free to change. A module extends the standard
fragment plus the variants that fit, and states in its own attributes only what is its own.
"""

from __future__ import annotations


class ModuleDocFragment:
    # Standard fragment: what each attribute means; every module says how far it supports them.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and report what would change without changing it.
  diff_mode:
    description: Returns what changed (or would change in check mode) in diff mode.
  idempotent:
    description:
      - Run twice in a row outside check mode with the same arguments, the second call reports
        no change.
      - This assumes that nothing else changed what the module controls or reads in between.
"""

    # With the standard fragment: a module that only reads and reports.
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: This module changes nothing.
  diff_mode:
    support: N/A
    details: This module changes nothing.
  idempotent:
    support: full
    details: This module changes nothing.
"""

    # A module whose work is done (wholly or in part) by the collection's action plugin of the
    # same name, in the controller's process.
    ACTION = r"""
options: {}
attributes:
  action:
    description: Has a corresponding action plugin, so some or all of the work runs on the controller.
    support: full
"""
