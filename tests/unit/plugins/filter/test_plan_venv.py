"""The job's locked venv in the plan: the lock read and checked on the controller, each node's
venv and interpreter, the key that decides reuse."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from ansible_collections.torchherd.cluster.plugins.filter.redact import redact
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.runtime import unpinned

GROUPS = {"torchherd_nodes": ["a", "b"]}
HOSTVARS = {"a": {"ansible_host": "10.0.0.1", "ansible_python_interpreter": "/usr/bin/python3"},
            "b": {"ansible_host": "10.0.0.2", "torchherd_root": "/scratch/th",
                  "torchherd_python": "/opt/py/bin/python"}}


def run(code, hostvars=HOSTVARS, **venv):
    return plan({"script": "train.py", "code_src": str(code), "venv": venv}, GROUPS, hostvars)


def test_each_node_runs_the_venv_made_from_its_own_python(tmp_path):
    (tmp_path / "req.lock").write_text("numpy==2.4.6\n")
    p = run(tmp_path, lock="req.lock")
    a, b = p["nodes"]
    assert a["venv"]["base_python"] == "/usr/bin/python3"
    assert b["venv"]["base_python"] == "/opt/py/bin/python"
    assert a["python"] == f"~/.torchherd/venvs/{a['venv']['key']}/bin/python"
    assert b["venv"]["path"] == f"/scratch/th/venvs/{b['venv']['key']}"
    # Another interpreter, another venv.
    assert a["venv"]["key"] != b["venv"]["key"] and p["venv"]


def test_the_key_follows_the_lock_and_what_shapes_the_venv_not_where_packages_come_from(
        tmp_path):
    (tmp_path / "req.lock").write_text("numpy==2.4.6\n")

    def key(**venv):
        return run(tmp_path, lock="req.lock", **venv)["nodes"][0]["venv"]["key"]

    first = key()
    assert key(find_links=["http://wheels/"], index_url="https://mirror/simple") == first
    assert key(system_site_packages=True) != first
    (tmp_path / "req.lock").write_text("numpy==2.4.7\n")
    assert key() != first


def test_without_a_lock_the_nodes_run_their_own_python(tmp_path):
    p = run(tmp_path)
    assert p["venv"] is None and "venv" not in p["nodes"][0]
    assert p["nodes"][0]["python"] == "/usr/bin/python3"


def test_a_missing_lock_and_a_lock_that_pins_nothing_are_refused(tmp_path):
    with pytest.raises(AnsibleFilterError, match=r"job\.venv\.lock: expected a lock file"):
        run(tmp_path, lock="nothing.lock")
    (tmp_path / "req.txt").write_text("numpy>=2\ntorch==2.13.0\n")
    with pytest.raises(AnsibleFilterError, match=r"pinned with == .*found numpy>=2; fix"):
        run(tmp_path, lock="req.txt")


def test_what_counts_as_pinned():
    text = ("# made by uv pip compile\n"
            "numpy==2.4.6 \\\n    --hash=sha256:00ff\n"
            "torch===2.13.0+cpu ; python_version >= '3.10'\n"
            "thpin @ https://wheels/thpin-1.0-py3-none-any.whl\n"
            "--index-url https://mirror/simple\n"
            "loose\nranged>=1,<2\nnotequal!=1\n-r more.txt\n-e ./src\n")
    assert unpinned(text) == ["loose", "ranged>=1,<2", "notequal!=1", "-r more.txt",
                              "-e ./src"]


def test_an_index_urls_credentials_never_reach_the_plan(tmp_path):
    (tmp_path / "req.lock").write_text("numpy==2.4.6\n")
    p = run(tmp_path, lock="req.lock", index_url="https://user:s3cret@mirror.example/simple")
    assert p["job"]["venv"]["index_url"] == "https://********@mirror.example/simple"
    assert "s3cret" not in repr(p)
    assert redact({"index_url": "http://mirror/simple"}) == {"index_url": "http://mirror/simple"}


def test_uvs_own_lock_needs_its_project_and_its_key_hashes_both(tmp_path):
    (tmp_path / "uv.lock").write_text('version = 1\n[[package]]\nname = "thpin"\n')
    with pytest.raises(AnsibleFilterError, match=r"expected pyproject\.toml beside uv\.lock"):
        run(tmp_path, lock="uv.lock")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "t"\ndependencies = ["thpin"]\n')
    first = run(tmp_path, lock="uv.lock")["nodes"][0]["venv"]["key"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "t"\ndependencies = []\n')
    assert run(tmp_path, lock="uv.lock")["nodes"][0]["venv"]["key"] != first
