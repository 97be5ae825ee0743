"""Every module of the collection ends without its interpreter's last garbage collection
(module_utils._exit): a task's result reaches Ansible only when the module's process ends."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

COLLECTION = Path(__file__).resolve().parents[4] / "collection"
MODULES = COLLECTION / "ansible_collections" / "torchherd" / "cluster" / "plugins" / "modules"


def test_the_heap_is_frozen_at_exit_and_not_before():
    # A handler registered first runs last (atexit: last in, first out) and sees it; twice
    # called, still one handler.
    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('at exit:', gc.get_freeze_count() > 0))\n"
            "from ansible_collections.torchherd.cluster.plugins.module_utils._exit import "
            "skip_last_collection\n"
            "skip_last_collection(); skip_last_collection()\n"
            "print('before exit:', gc.get_freeze_count() > 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=COLLECTION, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before exit: False", "at exit: True"], done.stdout


def test_every_modules_main_calls_it_first():
    modules = [p for p in sorted(MODULES.glob("*.py")) if "AnsibleModule(" in p.read_text()]
    assert len(modules) >= 9, modules
    for path in modules:
        tree = ast.parse(path.read_text())
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        first = main.body[0]
        called = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                  and getattr(first.value.func, "id", None) == "skip_last_collection")
        assert called, f"{path.name}: main does not call skip_last_collection() first"
