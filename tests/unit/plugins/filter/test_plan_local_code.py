"""Nodes on this machine whose root (or code directory) lies inside the job's code_src: the
sync would copy the node's earlier copies into the next one at every launch, so the plan
refuses it before any node is touched, unless the sync's ignore rules leave it out."""

import os
import re
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import Rules, manifest

CHECKOUT = Path(__file__).resolve().parents[4]
GROUPS = {"torchherd_nodes": ["node0", "node1"]}
LOCAL = {"ansible_connection": "local"}


def local_nodes(**own):
    """Two nodes on this machine (local.ini's kind); ``own``: node0's own variables."""
    return {"node0": {**LOCAL, "ansible_host": "127.0.0.1", **own},
            "node1": {**LOCAL, "ansible_host": "127.0.0.2",
                      "torchherd_root": "/var/tmp/th-elsewhere/node1"}}


def run(code, hostvars, playbook="launch", **job):
    return plan({"script": "train.py", "code_src": str(code), **job}, GROUPS, hostvars,
                playbook=playbook)


def refused(code, hostvars, **job):
    with pytest.raises(AnsibleFilterError, match="the job cannot start") as info:
        run(code, hostvars, **job)
    return str(info.value)


@pytest.fixture
def code(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    return tmp_path / "code"


def test_a_local_nodes_root_inside_code_src_is_refused_with_the_host_the_paths_and_the_fix(code):
    msg = refused(code, local_nodes(torchherd_root=str(code / "nodes" / "node0")))
    assert (f"host node0: torchherd_root: expected a directory outside code_src {code} "
            f"(the node is this machine") in msg
    assert (f"found {code / 'nodes' / 'node0'} inside it and part of the code; fix: set "
            f"torchherd_root to a directory outside code_src, or leave it out of the code "
            f"with the line /nodes/node0/ in {code}/.torchherdignore") in msg
    assert "node1" not in msg  # its root is elsewhere


def test_the_same_root_on_a_remote_node_says_nothing_of_this_machines_code(code):
    root = str(code / "nodes" / "node0")
    # SSH, even to a loopback address: another user's home, or a container behind a port.
    for hv in ({"ansible_host": "10.0.0.1"}, {"ansible_host": "127.0.0.1", "ansible_port": 2222},
               {"ansible_host": "127.0.0.1", "ansible_connection": "ssh"}):
        hostvars = {"node0": {**hv, "torchherd_root": root}, "node1": {"ansible_host": "10.0.0.2"}}
        assert run(code, hostvars)["nodes"][0]["root"] == root
    assert run(code, local_nodes(torchherd_root=root, ansible_connection="ansible.builtin.local"),
               playbook="verify")  # a verify syncs nothing
    refused(code, local_nodes(torchherd_root=root, ansible_connection="ansible.builtin.local"))


def test_a_root_the_sync_leaves_out_is_planned_and_its_files_are_not_the_codes(code):
    root = code / "nodes" / "node0"
    hostvars = local_nodes(torchherd_root=str(root))
    # The line the message suggests, while the root does not exist yet (the first launch).
    (code / ".torchherdignore").write_text("/nodes/node0/\n")
    assert run(code, hostvars)["nodes"][0]["root"] == str(root)
    # After a launch the root holds the node's copy: the sync's own listing leaves it out.
    (root / "code" / "train").mkdir(parents=True)
    (root / "code" / "train" / "train.py").write_text("print('hi')\n")
    assert run(code, hostvars)
    assert manifest(Rules(str(code), [], True)) == [".torchherdignore", "train.py"]
    (code / ".torchherdignore").unlink()
    refused(code, hostvars)
    # A .gitignore of a parent directory, and the job's excludes (rsync-like), leave it out too.
    (code / ".gitignore").write_text("nodes/\n")
    assert run(code, hostvars)
    assert run(code, hostvars, gitignore=False, excludes=["node0"])
    refused(code, hostvars, gitignore=False)
    # The default excludes leave out any directory named runs.
    assert run(code, local_nodes(torchherd_root=str(code / "runs" / "node0")))


def test_tilde_relative_paths_and_symlinks_are_resolved_as_the_sync_resolves_them(
        code, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    msg = refused(code, local_nodes(torchherd_root="~/code/.th"))
    assert f"found ~/code/.th ({code / '.th'}) inside it" in msg
    monkeypatch.chdir(code)
    msg = refused(".", local_nodes(torchherd_root="nodes/node0"))
    assert f"code_src {code} " in msg and f"found nodes/node0 ({code / 'nodes' / 'node0'})" in msg
    # code_src through a link, and a root through another.
    (tmp_path / "src-link").symlink_to(code)
    (tmp_path / "root-link").symlink_to(code / "nodes", target_is_directory=True)
    (code / "nodes").mkdir()
    msg = refused(tmp_path / "src-link", local_nodes(torchherd_root=str(tmp_path / "root-link")))
    assert f"code_src {code} " in msg and f"({code / 'nodes'}) inside it" in msg
    # A link inside code_src is sent as a link, never followed: a root behind it is outside.
    (tmp_path / "scratch").mkdir()
    (code / "scratch").symlink_to(tmp_path / "scratch", target_is_directory=True)
    assert run(code, local_nodes(torchherd_root=str(code / "scratch" / "node0")))
    # A sibling whose name starts like code_src's is outside it.
    assert run(code, local_nodes(torchherd_root=str(tmp_path / "codex" / "node0")))


def test_a_root_that_is_code_src_itself_has_one_fix(code):
    msg = refused(code, local_nodes(torchherd_root=str(code)))
    assert f"found {code}, code_src itself; fix: set torchherd_root to a directory outside " \
           f"code_src\n" in msg + "\n"
    assert ".torchherdignore" not in msg


def test_the_default_root_inside_a_code_src_as_wide_as_home_is_named_as_the_default(
        tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "train.py").write_text("")
    hostvars = {name: {k: v for k, v in hv.items() if k != "torchherd_root"}
                for name, hv in local_nodes().items()}
    msg = refused(tmp_path, hostvars)
    for node in ("node0", "node1"):
        assert (f"host {node}: torchherd_root (default ~/.torchherd): expected a directory "
                f"outside code_src {tmp_path} ") in msg
    assert f"with the line /.torchherd/ in {tmp_path}/.torchherdignore" in msg


def test_a_code_directory_inside_code_src_is_refused_and_code_src_itself_is_not(code):
    msg = refused(code, local_nodes(torchherd_code_dest=str(code / "copy")))
    assert f"host node0: torchherd_code_dest: expected a directory outside code_src {code}" in msg
    assert "fix: set torchherd_code_dest to a directory outside code_src, or leave it empty" in msg
    msg = refused(code, local_nodes(), code_dest=str(code / "copy"))
    assert "host node0: job.code_dest:" in msg and "host node1: job.code_dest:" in msg
    # A copy onto itself adds nothing.
    assert run(code, local_nodes(torchherd_code_dest=str(code)))


def test_every_problem_is_reported_with_the_others(code):
    msg = refused(code, local_nodes(torchherd_root=str(code / "n0")), master_port=0)
    assert "job.master_port" in msg and "host node0: torchherd_root" in msg


def test_the_demo_inventory_puts_each_nodes_root_in_the_users_home_outside_the_examples(
        tmp_path, monkeypatch):
    # Two users of one machine never share a root: each resolves ~ to their own home.
    source = CHECKOUT / "inventories" / "local.ini"
    roots = re.findall(r"torchherd_root=(\S+)", source.read_text())
    assert len(roots) == 2 and all(r.startswith("~/") for r in roots), roots
    monkeypatch.setenv("HOME", str(tmp_path))
    inventory = InventoryManager(loader=DataLoader(), sources=[str(source)])
    manager = VariableManager(loader=DataLoader(), inventory=inventory)
    hostvars = {h.name: manager.get_vars(host=h) for h in inventory.get_hosts()}
    nodes = run(CHECKOUT / "examples", hostvars, script="allreduce.py")["nodes"]
    assert [os.path.expanduser(n["root"]) for n in nodes] == [
        str(tmp_path / ".torchherd" / "local" / n) for n in ("node0", "node1")]
    # The same inventory with the examples as the whole home: refused, not copied into itself.
    (tmp_path / "allreduce.py").write_text("")
    refused(tmp_path, hostvars, script="allreduce.py")
