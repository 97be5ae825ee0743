"""The public Python API: what `import torchherd` promises, and what docs/api.md shows of it."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import driver
import torchherd

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.mark.parametrize("name", torchherd.__all__)
def test_every_public_name_exists_and_has_its_own_docstring(name):
    obj = getattr(torchherd, name)
    assert obj is getattr(driver.api, name, None) or obj is getattr(driver, name), name
    doc = inspect.getdoc(obj)
    assert doc and (not inspect.isclass(obj) or obj.__doc__ is not None), name
    # Named as code in the doc (a row, a heading or an example), not only a word of its prose.
    assert re.search(rf"`{re.escape(name)}[`(]|^#+ {re.escape(name)}\b|\b{re.escape(name)}\(",
                     DOC.read_text(encoding="utf-8"), re.M), f"{name} is not in docs/api.md"


def test_the_version_is_a_version_and_both_packages_ship_py_typed():
    assert re.fullmatch(r"\d+(\.\d+)*(\+\w+)?", torchherd.__version__)
    for package in (torchherd, driver):
        assert (Path(package.__file__).parent / "py.typed").is_file()


def test_python_m_torchherd_is_the_cli():
    done = subprocess.run([sys.executable, "-m", "torchherd", "--version"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.startswith("torchherd ")


def test_the_examples_of_docs_api_md_compile():
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"),
                        flags=re.S | re.M)
    assert len(blocks) >= 3
    for number, block in enumerate(blocks):
        compile(block, f"docs/api.md python block {number}", "exec")
        # Every torchherd.<name> the examples use is part of the API.
        used = set(re.findall(r"\btorchherd\.(\w+)", block))
        assert used <= set(torchherd.__all__), used - set(torchherd.__all__)


def test_the_example_of_bad_input_raises_what_docs_api_md_says(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    block = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"),
                       flags=re.S | re.M)[-1]
    printed = []
    exec(compile(block, "docs/api.md", "exec"), {"print": printed.append})
    assert "job key 'code_src': expected a directory on this machine" in str(printed[0])
