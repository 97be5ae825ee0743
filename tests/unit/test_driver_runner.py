"""Secrets out of ansible-runner events before anyone sees them (driver.runner)."""

from driver.runner import scrub, secret_values


def test_secret_values_found_at_any_depth():
    extravars = {"torchherd_job": {"env": {"A": "plain"},
                                   "secret_env": {"K": "abc", "T": "abcdef", "N": 42}}}
    assert secret_values(extravars) == ["abcdef", "abc", "42"]
    assert secret_values({"torchherd_run_id": "r1"}) == []


def test_scrub_replaces_values_in_every_string_and_keeps_the_rest():
    event = {"event": "runner_on_ok", "stdout": "ok: [n0] => {'K': 'abcdef'}",
             "event_data": {"res": {"ansible_facts": {"torchherd_plan": {"job": {
                 "secret_env": {"K": "abcdef"}, "master_port": 29500}}}},
                 "hosts": ["n0", "xabcx"]}}
    clean = scrub(event, ["abcdef", "abc"])
    assert "abc" not in repr(clean)
    assert clean["stdout"] == "ok: [n0] => {'K': '********'}"
    assert clean["event_data"]["res"]["ansible_facts"]["torchherd_plan"]["job"] == {
        "secret_env": {"K": "********"}, "master_port": 29500}
    assert clean["event_data"]["hosts"] == ["n0", "x********x"]
    assert event["stdout"].endswith("'abcdef'}")  # the original is untouched
    assert scrub(event, []) is event
