"""The launch's schedule as a truth table over its inputs: forks against nodes, the barrier's
setting, the hang watch, the rendezvous, detach, the interconnect check, the launcher, ssh or
srun, and the playbook; and each node's part of it over root or not, a launcher started ahead
and the rules its start opened."""

import itertools

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.node_schedule import node_schedule
from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from ansible_collections.torchherd.cluster.plugins.filter.schedule import FREE, LINEAR, schedule
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from driver.runner import all_at_once

HOSTS = ["n0", "n1", "n2", "n3"]
GROUPS = {"torchherd_nodes": HOSTS}
HOSTVARS = {h: {"ansible_host": f"10.0.0.{i + 1}"} for i, h in enumerate(HOSTS)}


def planned(barrier=True, **job):
    job.setdefault("script", "train.py")
    if job.get("rdzv") == "c10d":
        job.setdefault("nnodes", "2:4")
    # The barrier's setting is the nodes' (an INI inventory gives it as a string); srun needs
    # the nodes of a SLURM job.
    slurm = {"torchherd_slurm_job_id": "42"} if job.get("spawn") == "srun" else {}
    hostvars = {h: {**hv, **slurm, "torchherd_torchrun_barrier": "true" if barrier else "false"}
                for h, hv in HOSTVARS.items()}
    return plan(job, GROUPS, hostvars, run_id="r1")


# The inputs, each with its values; every combination is a row of the table.
FORKS = {"all": 4, "fewer": 2}
JOBS = {
    "plain": {},
    "hang": {"hang_timeout": 60},
    "elastic": {"rdzv": "c10d", "max_restarts": 1},
    "detach": {"detach": True},
    "interconnect": {"interconnect": "always"},
}
LAUNCHERS_USED = ["torchrun", "accelerate"]
SPAWNS = ["ssh", "srun"]
# The last launch of the same job whose preflight passed (plan_run's), or none.
PRIORS = {"none": None, "relaunch": {"run_id": "r0", "facts": {h: {"euid": 0} for h in HOSTS}}}


def expected(forks, barrier, job, live=0, spawn="ssh", prior="none"):
    """The rules, written out once more the plain way, to hold the filter to them."""
    together = forks == "all"
    hang, elastic = "hang_timeout" in job, job.get("rdzv") == "c10d"
    detach, measure = job.get("detach", False), job.get("interconnect") == "always"
    where = "start" if together and barrier else "none" if together else "supervisors"
    gang = where != "none"
    free = hang or not gang
    alone = not together or (not free and not elastic and not detach)
    return {
        "all_at_once": together,
        "forks_ok": together or not (hang or measure),
        "barrier": where,
        "gang": gang,
        "start_opens": not measure,
        "hosts": ["n0"] if alone else HOSTS,
        "strategy": FREE if free else LINEAR,
        "stops_all": free,
        "once": detach,
        "if_gang_incomplete": "watch_every_node" if alone else "nothing",
        "teardown": "none" if detach else "nodes_with_rules",
        # One wait speaks for the job: a live view gets word in its rounds, else the job's.
        "round": 0 if detach else live if live and alone and not hang else 3600,
        # The same wait, for a live view, also returns with the nodes' changed lines, at most
        # every second; where every node is watched the lines come with the rounds.
        "lines": min(live, 1.0) if live and alone and not detach else 0.0,
        # A launcher on the nodes themselves starts ahead, whatever else; srun starts it anew.
        "warm": spawn == "ssh",
        "hang": hang and not detach,
        "lost_fails": not elastic,
        "spawn": dict.fromkeys(HOSTS, spawn),
        # Every node samples its use at the job's interval (5 s unless the job says), detached
        # or not.
        "sample_every": 5.0,
        # A relaunch's start comes with the facts call where the barrier is in the start's call
        # (a node that refuses calls it off everywhere), ssh starts the launcher and nothing
        # comes between the facts and the start.
        "with_facts": prior != "none" and where == "start" and spawn == "ssh" and not measure,
    }


# The plan refuses an elastic rendezvous for any launcher but torchrun.
@pytest.mark.parametrize("forks,barrier,kind,live,launcher,spawn,prior", [
    row for row in itertools.product(FORKS, [True, False], JOBS, [0, 5], LAUNCHERS_USED, SPAWNS,
                                     PRIORS)
    if row[2] != "elastic" or row[4] == "torchrun"])
def test_truth_table(forks, barrier, kind, live, launcher, spawn, prior):
    job = dict(JOBS[kind], launcher=launcher, spawn=spawn)
    s = schedule(planned(barrier, **job), FORKS[forks], progress_every=live, prior=PRIORS[prior])
    got = {
        "all_at_once": s["all_at_once"], "forks_ok": s["forks_ok"], "barrier": s["barrier"],
        "gang": s["gang"], "start_opens": s["firewall"]["start_opens"],
        "hosts": s["watch"]["hosts"], "strategy": s["watch"]["strategy"],
        "stops_all": s["watch"]["stops_all"], "once": s["watch"]["once"],
        "if_gang_incomplete": s["watch"]["if_gang_incomplete"], "teardown": s["teardown"],
        "round": s["watch"]["round"], "warm": s["start"]["warm"],
        "hang": s["watch"]["hang"], "lost_fails": s["watch"]["lost_fails"],
        "spawn": s["spawn"], "sample_every": s["start"]["sample_every"],
        "lines": s["watch"]["lines"], "with_facts": s["start"]["with_facts"],
    }
    assert got == expected(forks, barrier, JOBS[kind], live, spawn, prior)
    # Every decision says why.
    assert set(s["why"]) == {"barrier", "watch", "firewall", "teardown", "round", "restart",
                             "venv", "container", "start", "hang", "lost_fails", "spawn",
                             "sample", "lines", "waves", "with_facts"}


def test_a_relaunchs_start_comes_with_its_facts_only_where_nothing_comes_between():
    """Every reason the start must follow the facts call is named; where the firewall role opens
    a node's rules (its job does not run as root there) the start must wait for it."""
    prior = PRIORS["relaunch"]
    assert schedule(planned(), 4, prior=prior)["start"]["with_facts"]
    assert "run r0" in schedule(planned(), 4, prior=prior)["why"]["with_facts"]
    walled = {h: {**hv, "torchherd_firewall": True} for h, hv in HOSTVARS.items()}
    as_user = {"run_id": "r0", "facts": {h: {"euid": 1000} for h in HOSTS}}
    cases = [
        (planned(), 4, None, "launch", "no earlier launch"),
        (planned(), 4, prior, "verify", "verify starts no job"),
        (planned(), 2, prior, "launch", "the barrier is not in the start's call"),
        (planned(interconnect="always"), 4, prior, "launch", "the interconnect check"),
        (plan({"script": "t.py"}, GROUPS, walled, run_id="r1"), 4, as_user, "launch",
         "the firewall role opens n0's rules"),
        (dict(planned(), restart=1), 4, prior, "launch", "a restart of the run"),
        (dict(planned(), spares=[{"host": "n9"}]), 4, prior, "launch", "spares"),
        (dict(planned(), venv={"key": "k"}), 4, prior, "launch", "venv or finds its image"),
    ]
    for p, forks, given, playbook, why in cases:
        s = schedule(p, forks, playbook=playbook, prior=given)
        assert not s["start"]["with_facts"], why
        assert why in s["why"]["with_facts"], s["why"]["with_facts"]
    # As root there, the start opens the rules itself: nothing comes between.
    as_root = schedule(plan({"script": "t.py"}, GROUPS, walled, run_id="r1"), 4, prior=prior)
    assert as_root["start"]["with_facts"]


def test_fewer_forks_than_nodes_run_each_task_in_waves():
    s = schedule(planned(), 2)
    assert s["waves"] == (len(s["spawn"]) + 1) // 2 > 1
    assert f"2 forks for {len(s['spawn'])} nodes" in s["why"]["waves"]
    s = schedule(planned(), 64)
    assert s["waves"] == 1 and s["why"]["waves"].startswith("one worker per node")


def test_the_nodes_use_is_sampled_at_the_jobs_interval_or_not_at_all():
    s = schedule(planned(sample_interval=2.5), 4)
    assert s["start"]["sample_every"] == 2.5 and "every 2.5 s" in s["why"]["sample"]
    s = schedule(planned(sample_interval=0), 4)
    assert s["start"]["sample_every"] == 0 and "not sampled" in s["why"]["sample"]


def test_barrier_off_with_fewer_forks_keeps_the_gang_and_says_why():
    # The controller can watch only some nodes: without the gang a failing worker on an
    # unwatched node would go unnoticed until the master ends.
    s = schedule(planned(barrier=False), 2)
    assert s["barrier"] == "supervisors" and s["gang"]
    assert s["watch"]["hosts"] == ["n0"] and s["watch"]["strategy"] == LINEAR
    assert "turned off" in s["why"]["barrier"]


def test_what_needs_every_node_at_once_is_named():
    s = schedule(planned(interconnect="always", hang_timeout=30), 2)
    assert not s["forks_ok"]
    assert s["forks_needed"] == ["the interconnect check (interconnect always)",
                                 "the hang watch (hang_timeout)"]
    assert schedule(planned(), 2)["forks_needed"] == []


def test_verify_runs_everything_at_once_and_the_role_opens_the_firewall():
    s = schedule(planned(), 2, playbook="verify")
    assert not s["forks_ok"] and "the master-port probe" in s["forks_needed"]
    assert not s["firewall"]["start_opens"]
    assert schedule(planned(), 4, playbook="verify")["forks_ok"]


def test_one_node_is_never_master_alone():
    s = schedule(plan({"script": "t.py"}, {"torchherd_nodes": ["n0"]}, HOSTVARS, run_id="r"), 5)
    assert s["watch"]["hosts"] == ["n0"]
    assert not s["watch"]["master_alone"] and s["watch"]["if_gang_incomplete"] == "nothing"


def test_not_a_plan_is_refused():
    with pytest.raises(AnsibleFilterError, match="expected the plan"):
        schedule({"script": "t.py"}, 4)


@pytest.mark.parametrize("playbook,job", [
    ("launch", {}), ("launch", {"hang_timeout": 60}), ("launch", {"interconnect": "always"}),
    ("launch", {"interconnect": "never"}), ("launch", {"detach": True, "hang_timeout": 5}),
    ("verify", {}),
])
def test_the_drivers_all_at_once_is_the_schedules(playbook, job):
    # The driver raises the forks where a playbook needs every node at once; the schedule is
    # where that is decided, and the two must not drift apart.
    needed = bool(schedule(planned(**job), 1, playbook=playbook)["forks_needed"])
    assert all_at_once(playbook, {"torchherd_job": {"script": "t.py", **job}}) == needed


def test_one_node_without_the_barrier_turns_it_off_for_the_launch():
    hostvars = {**HOSTVARS, "n2": {**HOSTVARS["n2"], "torchherd_torchrun_barrier": False}}
    p = plan({"script": "t.py"}, GROUPS, hostvars, run_id="r")
    assert p["barrier"] is False and schedule(p, 4)["barrier"] == "none"
    assert plan({"script": "t.py"}, GROUPS, HOSTVARS, run_id="r")["barrier"] is True


def test_a_job_started_on_verifys_plan_is_watched_on_every_node():
    # The roles on their own (molecule's scenarios) start and watch a job on a verify plan.
    s = schedule(planned(), 4, playbook="verify")
    assert s["watch"]["hosts"] == HOSTS and not s["watch"]["master_alone"]
    assert s["watch"]["if_gang_incomplete"] == "nothing"


def test_a_live_view_gets_every_nodes_line_from_the_wait_that_speaks_for_the_job():
    """The master's wait returns with its gang's changed lines at most every second (the
    view's own interval where shorter); one node's wait with its own; never where every node is
    watched, nor detached, nor without a live view."""
    s = schedule(planned(), 4, progress_every=5)
    assert (s["watch"]["master_alone"], s["watch"]["lines"]) == (True, 1.0)
    assert "every node's, as the master's gang hands them on" in s["why"]["lines"]
    assert schedule(planned(), 4, progress_every=0.5)["watch"]["lines"] == 0.5
    one = schedule(plan({"script": "t.py"}, {"torchherd_nodes": ["n0"]}, HOSTVARS, run_id="r"),
                   5, progress_every=5)
    assert one["watch"]["lines"] == 1.0 and "(the node's)" in one["why"]["lines"]
    for job, live, why in (({"hang_timeout": 60}, 5, "every node is watched"),
                           ({"detach": True}, 5, "detached"), ({}, 0, "no live view")):
        s = schedule(planned(**job), 4, progress_every=live)
        assert s["watch"]["lines"] == 0 and why in s["why"]["lines"]


def test_a_live_view_never_lengthens_a_shorter_watch_interval():
    s = schedule(planned(watch_interval=2), 4, progress_every=5)
    assert s["watch"]["round"] == 2


@pytest.mark.parametrize(("job", "restart", "playbook", "left", "on"), [
    ({}, 0, "launch", 0, []),
    ({"restarts": 2}, 0, "launch", 2, ["node_lost", "signal", "connection"]),
    ({"restarts": 2}, 1, "launch", 1, ["node_lost", "signal", "connection"]),
    ({"restarts": 2}, 2, "launch", 0, []),
    ({"restarts": 2, "restart_on": ["exception"]}, 0, "launch", 2, ["exception"]),
    ({"restarts": 2}, 0, "verify", 0, []),
])
def test_the_schedule_says_whether_a_restart_is_left(job, restart, playbook, left, on):
    p = {**planned(**job), "restart": restart}
    s = schedule(p, forks=4, playbook=playbook)
    assert s["restart"] == {"this": restart, "left": left, "on": on, "excluded": {},
                            "by": "driver" if left else "none", "launcher": 0,
                            "standbys": [], "standby_delay": 0.0}
    assert s["why"]["restart"]


def test_a_detached_jobs_restarts_are_torchruns_with_its_standbys():
    job = {"restarts": 2, "detach": True, "rdzv": "c10d", "nnodes": "",
           "restart_on": ["node_lost", "exception"]}
    p = planned(**job)
    p["nodes"][-1] = {**p["nodes"][-1], "standby": True}
    s = schedule(p, forks=4)
    assert s["restart"] == {"this": 0, "left": 0, "on": ["node_lost", "exception"],
                            "excluded": {}, "by": "torchrun", "launcher": 2,
                            "standbys": [HOSTS[-1]], "standby_delay": 10.0}
    assert "without a controller" in s["why"]["restart"] and HOSTS[-1] in s["why"]["restart"]
    # Its own max_restarts is torchrun's where the driver restarts the job, or nobody does.
    assert schedule(planned(max_restarts=3, rdzv="c10d"), 4)["restart"]["launcher"] == 3


def test_the_schedule_says_where_the_job_runs():
    assert schedule(planned(), 4)["container"] == "none"
    s = schedule(planned(container={"image": "localhost/train:1", "pull": "never"}), 4)
    assert s["container"] == "image"
    assert "localhost/train:1" in s["why"]["container"] and "pull never" in s["why"]["container"]


def test_the_schedule_says_where_the_jobs_venv_is_made(tmp_path):
    assert schedule(planned(), 4)["venv"] == "none"
    (tmp_path / "req.lock").write_text("numpy==2.4.6\n")
    s = schedule(planned(code_src=str(tmp_path), venv={"lock": "req.lock"}), 4)
    assert s["venv"] == "facts" and "req.lock" in s["why"]["venv"]


def warm_plan(hostvars=None, **job):
    hostvars = hostvars or HOSTVARS
    return plan(dict({"script": "train.py"}, **job), GROUPS,
                {h: dict(hv, torchherd_torchrun_warm="true") for h, hv in hostvars.items()},
                run_id="r1")


def test_the_launcher_starts_ahead_only_where_it_can_be_handed_the_job(monkeypatch):
    warm = schedule(warm_plan(), 4)["start"]
    assert warm == {"warm": True, "module": "torch.distributed.run", "deadline": 64.0,
                    "sample_every": 5.0, "with_facts": False}
    # Every launcher's module is the one its command line runs with -m.
    for launcher, module in (("accelerate", "accelerate.commands.launch"),
                             ("deepspeed", "deepspeed.launcher.launch")):
        assert schedule(warm_plan(launcher=launcher), 4)["start"] == {
            "warm": True, "module": module, "deadline": 64.0, "sample_every": 5.0,
            "with_facts": False}, launcher
    monkeypatch.setattr(LAUNCHERS["deepspeed"], "WARM_MODULE", None)
    left_off = plan({"script": "train.py"}, GROUPS, {
        h: dict(hv, torchherd_torchrun_warm="false" if h == "n2" else "true")
        for h, hv in HOSTVARS.items()}, run_id="r1")
    off = {"a node leaves it off": schedule(left_off, 4),
           "no module to start ahead": schedule(warm_plan(launcher="deepspeed"), 4),
           "srun starts it": schedule(warm_plan(
               {h: dict(hv, torchherd_slurm_job_id="42") for h, hv in HOSTVARS.items()},
               spawn="srun"), 4),
           "verify": schedule(warm_plan(), 4, playbook="verify")}
    for why, s in off.items():
        assert s["start"] == {"warm": False, "module": None, "deadline": 64.0,
                              "sample_every": 5.0, "with_facts": False}, why
        assert s["why"]["start"].startswith("the launcher starts with the start: "), why
    assert "turned off (torchherd_torchrun_warm false)" in \
        off["a node leaves it off"]["why"]["start"]
    assert schedule(planned(), 4)["start"]["warm"]


def test_spawn_auto_is_srun_on_the_nodes_of_a_slurm_job_alone():
    # A spare is started as the node it stands in for would be.
    hostvars = {h: dict(hv, **({"torchherd_slurm_job_id": "42"} if h in ("n1", "n3") else {}))
                for h, hv in HOSTVARS.items()}
    p = plan({"script": "t.py", "node_count": 3}, GROUPS, hostvars, run_id="r")
    assert [n["host"] for n in p["spares"]] == ["n3"]
    # The plan says which nodes are in a SLURM job (its slurm_job), the schedule reads it there.
    assert [n.get("slurm_job") for n in p["nodes"] + p["spares"]] == [None, "42", None, "42"]
    s = schedule(p, 4)
    assert s["spawn"] == {"n0": "ssh", "n1": "srun", "n2": "ssh", "n3": "srun"}
    assert "n1, n3" in s["why"]["spawn"]
    # The job's own choice holds everywhere.
    ssh = plan({"script": "t.py", "node_count": 3, "spawn": "ssh"}, GROUPS, hostvars, run_id="r")
    assert set(schedule(ssh, 4)["spawn"].values()) == {"ssh"}
    assert set(schedule(planned(), 4)["spawn"].values()) == {"ssh"}


# A node's part: the launch's schedule against what preflight learnt of the node (root or not,
# a launcher started ahead or not) and what its start did. Every combination is a row.
@pytest.mark.parametrize("job,spawn,firewall,euid,warm_started,opened", list(itertools.product(
    ["plain", "interconnect"], SPAWNS, [True, False], [0, 1000, None], [True, False], [0, 2])))
def test_each_nodes_part_as_a_truth_table(job, spawn, firewall, euid, warm_started, opened):
    slurm = {"torchherd_slurm_job_id": "42"} if spawn == "srun" else {}
    hostvars = {h: dict(hv, **slurm, torchherd_firewall_enabled=firewall)
                for h, hv in HOSTVARS.items()}
    p = plan(dict({"script": "train.py", "spawn": spawn}, **JOBS[job]), GROUPS, hostvars,
             run_id="r1")
    s = schedule(p, 4)
    facts = {} if euid is None else {"euid": euid}
    if warm_started:
        facts["warm"] = {"started": True}
    started = {"firewall": {"rules": ["r"] * opened}} if opened else {}
    part = node_schedule(s, p["nodes"][1], facts, started)
    # The rules, written out the plain way.
    who = ("none" if not firewall else
           "start" if job != "interconnect" and euid == 0 else "role")
    assert part["firewall"] == who, part["why"]
    assert part["warm"] == (warm_started and spawn == "ssh"), part["why"]
    assert part["wait_closes"] == bool(opened), part["why"]
    # The launcher starts ahead on the job's nodes spawned over ssh (torchrun here: it can).
    assert part["start_ahead"] == (spawn == "ssh" and s["start"]["warm"]), part["why"]
    assert set(part["why"]) == {"start_ahead", "firewall", "warm", "wait_closes"}
    assert all(isinstance(why, str) and why for why in part["why"].values())


def test_a_spares_launcher_never_starts_ahead():
    p = plan({"script": "train.py", "node_count": 3}, GROUPS,
             {h: dict(hv, torchherd_torchrun_warm="true") for h, hv in HOSTVARS.items()},
             run_id="r1")
    s = schedule(p, 4)
    assert s["start"]["warm"]
    assert [node_schedule(s, n)["start_ahead"] for n in p["nodes"]] == [True] * 3
    spare = node_schedule(s, p["spares"][0])
    assert not spare["start_ahead"] and "spare" in spare["why"]["start_ahead"]
    off = schedule(p, 4, playbook="verify")
    assert not node_schedule(off, p["nodes"][0])["start_ahead"]


def test_a_nodes_part_wants_the_schedule():
    with pytest.raises(AnsibleFilterError, match="expected the schedule"):
        node_schedule(planned(), {"host": "n0"})
