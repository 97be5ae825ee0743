"""Every plugin's DOCUMENTATION, RETURN and EXAMPLES parse as YAML (ansible-doc and ansible-test
sanity read them; a ': ' in a plain description line breaks them silently until then)."""

import ast
from pathlib import Path

import pytest
import yaml

PLUGINS = (Path(__file__).resolve().parents[3]
           / "collection/ansible_collections/torchherd/cluster/plugins")
DOCS = ("DOCUMENTATION", "RETURN", "EXAMPLES")


def documented():
    for path in sorted(PLUGINS.glob("*/*.py")):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in DOCS and isinstance(node.value, ast.Constant)):
                name = f"{path.parent.name}/{path.stem}:{node.targets[0].id}"
                yield pytest.param(node.value.value, id=name)


@pytest.mark.parametrize("text", list(documented()))
def test_the_docs_parse(text):
    assert yaml.safe_load(text) is not None
