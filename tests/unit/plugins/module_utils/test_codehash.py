"""What the sync leaves out of a code tree (module_utils/_codehash.py): the ignore files read
with git's semantics, checked against git itself where git decides, on real trees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import _codehash
from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import (
    MissingLibrary,
    Rules,
    code_hash,
    manifest,
)


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def listed(root: Path, excludes=(), gitignore=True) -> list[str]:
    return manifest(Rules(str(root), list(excludes), gitignore))


# Nested files, negation, directory-only and anchored rules, a deeper file overriding a
# shallower one, and a file that cannot be re-included because its directory is ignored.
GIT_CASES = {
    ".gitignore": "# data and logs stay local\ndata/\n*.log\n!keep.log\n/build\ncache\n",
    "train.py": "",
    "keep.log": "",
    "run.log": "",
    "build/out.bin": "",
    "src/build/generated.py": "",
    "data/big.bin": "x" * 1000,
    "data/.gitignore": "!big.bin\n",
    "src/model.py": "",
    "src/cache": "a file named like a directory rule of another kind",
    "src/.gitignore": "*.tmp\n!debug.log\nnotes/\n",
    "src/debug.log": "",
    "src/scratch.tmp": "",
    "src/notes/n.txt": "",
    "src/deep/notes": "a file: notes/ ignores directories only",
    "src/deep/.gitignore": "!*.tmp\n",
    "src/deep/kept.tmp": "",
}


def test_gitignore_semantics_as_git(tmp_path: Path) -> None:
    root = tree(tmp_path / "code", GIT_CASES)
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    # The user's own global ignore file must not take part.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run([git, "init", "-q", str(root)], check=True, env=env)
    by_git = subprocess.run(
        [git, "-C", str(root), "ls-files", "--others", "--exclude-standard"],
        check=True, capture_output=True, text=True, env=env).stdout.split()
    assert listed(root) == sorted(by_git)
    assert "data/big.bin" not in by_git and "src/deep/kept.tmp" in by_git  # the cases hold


def test_git_directory_is_never_listed(tmp_path: Path) -> None:
    root = tree(tmp_path, {"train.py": "", ".git/config": "", "vendor/lib/.git": "gitdir: x"})
    assert listed(root) == ["train.py"]


def test_excludes_apply_on_top_of_the_ignore_files(tmp_path: Path) -> None:
    root = tree(tmp_path, {".gitignore": "data/\n", "train.py": "", "data/x": "",
                           "runs/r1/log": "", "pkg/__pycache__/m.pyc": "", "pkg/m.py": ""})
    assert listed(root, ["runs", "__pycache__"]) == [".gitignore", "pkg/m.py", "train.py"]


def test_torchherdignore_leaves_out_and_its_negation_wins(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        ".gitignore": "*.ckpt\n",
        ".torchherdignore": "docs/\nsrc/**/fixtures/\n!init.ckpt\n",
        "train.py": "", "docs/guide.md": "", "src/a/fixtures/f.json": "", "src/a/m.py": "",
        "init.ckpt": "", "last.ckpt": "",
    })
    assert listed(root) == [".gitignore", ".torchherdignore", "init.ckpt", "src/a/m.py",
                            "train.py"]


def test_gitignore_off_reads_only_torchherdignore(tmp_path: Path) -> None:
    root = tree(tmp_path, {".gitignore": "data/\n", ".torchherdignore": "docs/\n",
                           "data/x": "", "docs/d": "", "train.py": ""})
    assert listed(root, gitignore=False) == [".gitignore", ".torchherdignore", "data/x",
                                             "train.py"]


def test_symlinked_directory_is_an_entry_matched_as_a_file(tmp_path: Path) -> None:
    root = tree(tmp_path, {".gitignore": "data/\n", "real/x": "", "train.py": ""})
    os.symlink("real", root / "data")
    assert listed(root) == [".gitignore", "data", "real/x", "train.py"]


def test_code_hash_counts_bytes_and_explains_what_it_left_out(tmp_path: Path) -> None:
    root = tree(tmp_path, {
        ".gitignore": "# local only\n\ndata/\n", "data/prep.py": "", "data/big.bin": "x" * 5000,
        "train.py": "print(1)\n", "runs/old.py": "", "src/.gitignore": "gen_*.py\n",
        "src/gen_model.py": "",
    })
    result = code_hash(str(root), [], ["runs"], True,
                       ["train.py", "data/prep.py", "runs/old.py", "src/gen_model.py",
                        ".git/hooks/x", "nowhere.py"])
    assert result["files"] == [".gitignore", "src/.gitignore", "train.py"]
    assert result["count"] == 3
    assert result["bytes"] == sum(len(text) for text in ("# local only\n\ndata/\n",
                                                         "gen_*.py\n", "print(1)\n"))
    assert result["left_out"] == {
        "data/prep.py": "data/ is left out by .gitignore line 3 ('data/')",
        "runs/old.py": "runs/ is left out by the job's excludes ('runs')",
        "src/gen_model.py": "src/gen_model.py is left out by src/.gitignore line 1 ('gen_*.py')",
        ".git/hooks/x": ".git/ is left out by torchherd itself (a .git is never sent)",
    }
    # A node proves its copy with the same hash from the manifest alone.
    assert code_hash(str(root), result["files"], [], True, [])["hash"] == result["hash"]


def test_without_pathspec_only_a_tree_with_ignore_files_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pathspec not installed: its import fails (None in sys.modules makes it raise).
    monkeypatch.setitem(sys.modules, "pathspec", None)
    plain = tree(tmp_path / "plain", {"train.py": ""})
    assert listed(plain) == ["train.py"]
    ignoring = tree(tmp_path / "ignoring", {"train.py": "", "sub/.gitignore": "*.bin\n"})
    with pytest.raises(MissingLibrary, match=r"sub/\.gitignore under .*pathspec") as missing:
        listed(ignoring)
    # The module's failure carries the import's own traceback.
    assert "from pathspec import GitIgnoreSpec" in missing.value.import_error
    assert listed(ignoring, gitignore=False) == ["sub/.gitignore", "train.py"]


def test_a_node_that_hashes_a_list_never_imports_pathspec() -> None:
    """node_facts hashes the code already on the node from the controller's list: importing
    pathspec there (where it is installed) would cost every preflight 30-40 ms. Where it is
    not installed, nothing could import it: the test proves nothing there."""
    pytest.importorskip("pathspec")
    collection = Path(_codehash.__file__).parents[5]
    code = (f"import sys; sys.path.insert(0, {str(collection)!r})\n"
            "import ansible_collections.torchherd.cluster.plugins.modules.node_facts\n"
            "print('pathspec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
