"""The node_facts action: where ssh ended before the module was sent, ssh's own reason."""

from unittest import mock

import pytest
from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.action.node_facts import ActionModule

NOT_SENT = AnsibleConnectionFailure(
    "Data could not be sent to remote host \"10.0.0.2\". Make sure this host can be reached "
    "over ssh: [Errno 32] Broken pipe")
HOST_KEY = AnsibleConnectionFailure("Failed to connect to the host via ssh: Host key "
                                    "verification failed.")


def action(module, again=None):
    task = mock.MagicMock()
    task.args = {"root": "~/.torchherd"}
    plugin = ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                          mock.MagicMock(), mock.MagicMock())
    plugin._execute_module = mock.MagicMock(side_effect=[module])
    plugin._low_level_execute_command = mock.MagicMock(
        side_effect=[again] if isinstance(again, Exception) else None,
        return_value={"rc": 0, "stdout": "", "stderr": ""})
    return plugin


@pytest.fixture(autouse=True)
def _no_base_run():
    with mock.patch.object(ActionBase, "run", return_value={}):
        yield


def test_the_modules_answer_is_the_result():
    plugin = action({"torch": {"version": "2.13.0"}, "changed": False})
    assert plugin.run(task_vars={}) == {"torch": {"version": "2.13.0"}, "changed": False}
    plugin._low_level_execute_command.assert_not_called()


def test_where_the_module_could_not_be_sent_ssh_says_why():
    plugin = action(NOT_SENT, HOST_KEY)
    with pytest.raises(AnsibleConnectionFailure, match="Host key verification failed"):
        plugin.run(task_vars={})
    # One command that sends nothing, without become: only ssh's answer is wanted.
    plugin._low_level_execute_command.assert_called_once_with("true", sudoable=False)


def test_where_ssh_answers_the_second_ask_the_first_failure_stands():
    plugin = action(NOT_SENT)
    with pytest.raises(AnsibleConnectionFailure, match="could not be sent"):
        plugin.run(task_vars={})


def test_other_failures_are_not_asked_again():
    plugin = action(AnsibleConnectionFailure("ssh: connect to host 10.0.0.2 port 22: "
                                             "Connection refused"))
    with pytest.raises(AnsibleConnectionFailure, match="Connection refused"):
        plugin.run(task_vars={})
    plugin._low_level_execute_command.assert_not_called()


def test_the_option_arguments_is_spread_into_the_modules_arguments():
    # Preflight hands filter facts_args' answer on whole, beside the venv; an option given on
    # its own wins.
    plugin = action({"changed": False})
    plugin._task.args = {"venv": {}, "root": "/r",
                         "arguments": {"root": "~/.torchherd", "python": "/usr/bin/python3"}}
    plugin.run(task_vars={})
    assert plugin._execute_module.call_args.kwargs["module_args"] == {
        "venv": {}, "root": "/r", "python": "/usr/bin/python3"}
