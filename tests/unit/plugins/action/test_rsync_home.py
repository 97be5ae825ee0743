"""The sync to a node on this machine resolves ~ by HOME, as the node's modules do: the code
lands where the job looks for it also where HOME is not the account's home."""

from __future__ import annotations

import shutil
from pathlib import Path
from unittest import mock

import pytest
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.action.rsync import ActionModule

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")


def test_a_local_nodes_tilde_is_this_processs_home(tmp_path: Path, monkeypatch) -> None:
    home, src = tmp_path / "home", tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("HOME", str(home))
    task = mock.MagicMock(check_mode=False)
    task.args = {"src": str(src), "dest": "~/.torchherd/local/node0/code/train"}
    connection = mock.MagicMock(transport="local")
    plugin = ActionModule(task, connection, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                          mock.MagicMock())
    plugin._remote_expand_user = mock.MagicMock(side_effect=AssertionError("asked the account"))
    with mock.patch.object(ActionBase, "run", return_value={}):
        result = plugin.run(task_vars={})
    assert result["changed"] and not result.get("failed"), result
    assert (home / ".torchherd" / "local" / "node0" / "code" / "train" / "train.py").is_file()
