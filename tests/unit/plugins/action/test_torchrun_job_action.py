"""The torchrun_job action: a wait that loses the node once asks again; twice, it is lost."""

from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.action.torchrun_job import ActionModule

RUNNING = {"job_state": "running", "changed": False}


def action(state, answers):
    task = mock.MagicMock()
    task.args = {"state": state, "run_id": "r1"}
    task.async_val = 0
    connection = mock.MagicMock()
    plugin = ActionModule(task, connection, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                          mock.MagicMock())
    plugin._execute_module = mock.MagicMock(side_effect=answers)
    return plugin, connection


@pytest.fixture(autouse=True)
def _no_base_run():
    with mock.patch.object(ActionBase, "run", return_value={}):
        yield


def answered(result):
    """The module's answer, less the controller's time it came back (every answer has one)."""
    assert isinstance(result.pop("received_at"), float)
    return result


def test_an_answer_at_once_is_the_result():
    plugin, connection = action("waiting", [dict(RUNNING)])
    assert answered(plugin.run(task_vars={})) == RUNNING
    connection.reset.assert_not_called()


def test_one_hiccup_asks_again_on_a_fresh_connection():
    plugin, connection = action("waiting", [AnsibleConnectionFailure("timeout"), dict(RUNNING)])
    assert answered(plugin.run(task_vars={"inventory_hostname": "n1"})) == RUNNING
    connection.reset.assert_called_once()
    assert plugin._execute_module.call_count == 2


def test_two_failures_make_the_node_lost_as_a_result_not_an_exception():
    plugin, _connection = action("waiting", [AnsibleConnectionFailure("timeout"),
                                             AnsibleConnectionFailure("no route to host")])
    result = plugin.run(task_vars={})
    assert result["unreachable"] is True and result["lost"] is True
    assert "twice" in result["msg"] and "no route to host" in result["msg"]


@pytest.mark.parametrize("state", ["started", "stopped", "status"])
def test_other_states_are_not_retried(state):
    # A start must never run twice; stop and status have their own handling of a dead node.
    plugin, _connection = action(state, [AnsibleConnectionFailure("timeout"), dict(RUNNING)])
    with pytest.raises(AnsibleConnectionFailure):
        plugin.run(task_vars={})
    assert plugin._execute_module.call_count == 1


def test_the_option_arguments_is_spread_into_the_others_on_every_path():
    # The start's arguments come whole (filter start_args), as one option: the module sees
    # them as its own, a state among them decides the path (a wait is asked again), an option
    # given on its own wins, and the task's arguments are as they were afterwards.
    plugin, connection = action("status", [AnsibleConnectionFailure("timeout"), dict(RUNNING)])
    given = {"arguments": {"state": "waiting", "run_id": "r2", "wait_timeout": 5},
             "wait_timeout": 7}
    plugin._task.args = dict(given)
    seen = []
    answers = iter([AnsibleConnectionFailure("timeout"), dict(RUNNING)])

    def module(**_kwargs):
        seen.append(dict(plugin._task.args))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    plugin._execute_module = mock.MagicMock(side_effect=module)
    assert answered(plugin.run(task_vars={})) == RUNNING
    assert seen == [{"state": "waiting", "run_id": "r2", "wait_timeout": 7}] * 2
    connection.reset.assert_called_once()
    assert plugin._task.args == given


def test_the_secret_values_join_the_spread_arguments():
    plugin, _connection = action("status", [dict(RUNNING)])
    plugin._task.args = {"secret_env_var": "job",
                         "arguments": {"state": "started", "run_id": "r3", "env": {"A": "1"}}}
    plugin._remove_tmp_path = mock.MagicMock()
    plugin._templar.template = lambda value: value
    answered(plugin.run(task_vars={"job": {"secret_env": {"TOKEN": "x"}}}))
    args = plugin._execute_module.call_args.kwargs["module_args"]
    assert args == {"state": "started", "run_id": "r3", "env": {"A": "1"},
                    "secret_env": {"TOKEN": "x"}}


def test_arguments_that_are_no_mapping_are_refused():
    plugin, _connection = action("status", [dict(RUNNING)])
    plugin._task.args = {"arguments": ["state=started"]}
    with pytest.raises(AnsibleActionFail, match="arguments: expected a mapping"):
        plugin.run(task_vars={})
    plugin._execute_module.assert_not_called()
