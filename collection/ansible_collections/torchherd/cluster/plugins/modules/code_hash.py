#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: code_hash
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Content hash of a code tree, to prove every node runs the same code
description:
  - Without O(files), lists the files under O(path) and hashes them; this is how the controller
    fixes the job's code (the manifest that the sync sends) before the sync.
  - The listing leaves out the C(.git) directory, what O(excludes) match, what the C(.gitignore)
    files of the tree ignore (with O(gitignore); git's semantics, a deeper file's rules win),
    and what C(.torchherdignore) at O(path) ignores (same syntax; its rules win over the
    C(.gitignore) files).
  - Reading C(.gitignore) or C(.torchherdignore) files needs the Python library C(pathspec) where
    the listing runs (the controller, for the plan); hashing O(files) needs nothing.
  - With O(files), hashes exactly those files under O(path); this is how a node proves, after
    the sync, that it holds the same code as the controller.
  - The hash covers each file's relative path and content (a symlink's target for links).
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.INFO_MODULE
  - torchherd.cluster._attributes.ACTION
attributes:
  action:
    details: On the controller (the C(local) connection, no C(become)) the action hashes in
      its own process; elsewhere the module runs on the target.
options:
  path:
    description: Root of the code tree.
    type: path
    required: true
  files:
    description: Relative paths to hash; empty means every file under O(path).
    type: list
    elements: str
    default: []
  excludes:
    description: Patterns left out when listing; a pattern without C(/) matches any path component.
    type: list
    elements: str
    default: []
  gitignore:
    description: Leave out what the C(.gitignore) files under O(path) ignore when listing.
    type: bool
    default: true
  explain:
    description: Relative paths to explain when listing; for each that the listing left out,
      RV(left_out) says which rule did.
    type: list
    elements: str
    default: []
  return_files:
    description: Return the file list (the controller needs it; nodes do not).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Hash the job's code on the controller
  torchherd.cluster.code_hash:
    path: ./src
    excludes: [__pycache__]
    explain: [train.py]
    return_files: true
  delegate_to: localhost
  register: code

- name: Prove a node has the same code
  torchherd.cluster.code_hash:
    path: /var/tmp/torchherd/code/train
    files: "{{ code.files }}"
"""

RETURN = r"""
hash:
  description: sha256 of the tree.
  returned: always
  type: str
  sample: 9f2c1e...
count:
  description: Number of files hashed.
  returned: always
  type: int
  sample: 12
bytes:
  description: Total size of the files listed (a symlink counts as its target path).
  returned: when O(files) is empty
  type: int
  sample: 48213
left_out:
  description: For each path of O(explain) that the listing left out, the rule that did.
  returned: when O(files) is empty
  type: dict
  sample: {"data/train.py": "data/ is left out by .gitignore line 3 ('data/')"}
missing:
  description: Files of O(files) that are not under O(path).
  returned: always
  type: list
  elements: str
  sample: []
files:
  description: The files hashed.
  returned: when O(return_files=true)
  type: list
  elements: str
  sample: [train.py, model/net.py]
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import (
    MissingLibrary,
    code_hash,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            files=dict(type="list", elements="str", default=[]),
            excludes=dict(type="list", elements="str", default=[]),
            gitignore=dict(type="bool", default=True),
            explain=dict(type="list", elements="str", default=[]),
            return_files=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not os.path.isdir(p["path"]):
        module.fail_json(msg=f"code directory {p['path']} does not exist")
    try:
        result = code_hash(p["path"], p["files"], p["excludes"], p["gitignore"], p["explain"])
    except MissingLibrary as exc:
        module.fail_json(msg=f"{missing_required_lib('pathspec')} ({exc})",
                         exception=exc.import_error)
    if not p["return_files"]:
        result.pop("files", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
