"""ansible-runner events -> the per-node progress table (driver.progress).

The events come from a real ansible-runner run of a small playbook on this machine: roles of the
collection's shape (plan, preflight, sync, firewall, torchrun, collect) whose tasks call the
collection's own modules with arguments that change nothing (no torch import, firewall backend
none, a run id that never ran). Where a case needs a result the run cannot give (a failed job),
a recorded event of the right task gets that result, its task identity kept.
"""

from __future__ import annotations

import copy
import os
import sys

import ansible_runner
import pytest
from rich.console import Console

from driver.logs import parse_line
from driver.paths import shipped_collections_path
from driver.progress import (
    Progress,
    Row,
    elapsed,
    facts_cells,
    gpus_text,
    job_line,
    phase_of,
    row_cells,
)

NODES = ("n0", "n1")
RUN = "progress-test"


def role_files(root, name):
    """Task files of the collection's shape; ``name`` gives every task its display name."""
    job = "run_id: " + RUN + "\n    root: " + str(root / "node")
    return {
        "plan/tasks/main.yml": f"""
- name: {name('Compute the plan')}
  ansible.builtin.set_fact:
    torchherd_plan: {{job: {{rdzv: static, secret_env: {{K: s3cret}}}}, nproc_per_node: 2}}
- name: {name('Hash the code')}
  torchherd.cluster.code_hash:
    path: {root / 'code'}
- name: {name('Put the nodes in rank order')}
  ansible.builtin.add_host:
    name: "{{{{ item.0 }}}}"
    groups: run
    torchherd_node: {{node_rank: "{{{{ item.1 }}}}"}}
  loop: "{{{{ {list(NODES)} | zip(range(2)) | list }}}}"
  changed_when: false
""",
        "preflight/tasks/main.yml": f"""
- name: {name('Gather node facts')}
  torchherd.cluster.node_facts:
    python: {root / 'no-python'}
    root: {root / 'node'}
- name: {name('Compare the nodes')}
  ansible.builtin.set_fact:
    torchherd_gate: {{ok: true, nproc_per_node: 2, problems: []}}
  run_once: true
- name: {name('Record the verdict')}
  torchherd.cluster.run_record:
    run_dir: {root / 'runs' / RUN}
    files: {{preflight.json: "{{}}"}}
  run_once: true
- name: {name('Show the nodes, or stop before anything starts')}
  ansible.builtin.debug:
    msg: preflight failed
  failed_when: false
  run_once: true
""",
        "sync/tasks/main.yml": f"""
- name: {name('Sync the code')}
  torchherd.cluster.rsync:
    src: {root / 'code'}
    dest: {root / 'node' / 'code'}
""",
        "firewall/tasks/main.yml": f"""
- name: {name('Allow the job traffic')}
  torchherd.cluster.firewall_rules:
    run_id: {RUN}
    backend: none
""",
        "firewall/tasks/teardown.yml": f"""
- name: {name('Remove the rules')}
  torchherd.cluster.firewall_rules:
    state: absent
    run_id: {RUN}
    backend: none
""",
        # The start's task file; the state that starts a job would need torch.
        "torchrun/tasks/start.yml": f"""
- name: {name('Start torchrun')}
  torchherd.cluster.torchrun_job:
    state: status
    {job}
""",
        "torchrun/tasks/watch.yml": f"""
- name: {name('Watch the job')}
  ansible.builtin.import_tasks: wait.yml
""",
        "torchrun/tasks/wait.yml": f"""
- name: {name('Wait for the job')}
  torchherd.cluster.torchrun_job:
    state: waiting
    wait_timeout: 0
    {job}
  register: waited
""",
        "torchrun/tasks/stop.yml": f"""
- name: {name('Stop the job')}
  torchherd.cluster.torchrun_job:
    state: stopped
    grace: 0
    {job}
""",
        "collect/tasks/main.yml": f"""
- name: {name('Fetch the run directory')}
  torchherd.cluster.rsync:
    direction: pull
    src: {root / 'node'}
    dest: {root / 'runs' / RUN / 'nodes' / '{{ inventory_hostname }}'}
""",
        "collect/tasks/summary.yml": f"""
- name: {name('Write summary.json')}
  torchherd.cluster.run_summary:
    run_dir: {root / 'runs' / RUN}
    plan:
      run_id: {RUN}
      nodes: [{{host: n0, node_rank: 0, address: n0}}, {{host: n1, node_rank: 1, address: n1}}]
    results: "{{{{ dict(groups.run | zip(groups.run | map('extract', hostvars, 'waited'))) }}}}"
""",
    }


def playbook(name):
    def role(role, tasks_from="main"):
        return (f"    - name: {name(role + ' ' + tasks_from)}\n"
                f"      ansible.builtin.import_role: {{name: {role}, tasks_from: {tasks_from}}}\n")

    def play(title, hosts, *roles):
        return (f"- name: {name(title)}\n  hosts: {hosts}\n  gather_facts: false\n"
                "  tasks:\n" + "".join(roles))

    status = (f"    - name: {name('Report the state')}\n"
              f"      torchherd.cluster.torchrun_job: {{state: status, run_id: {RUN}, "
              "root: '{{ node_root }}'}\n")
    return "\n".join([
        play("Plan", "localhost", role("plan")),
        play("Launch", "run", role("preflight"), role("sync"), role("firewall"),
             role("torchrun", "start")),
        play("Watch", "run", role("torchrun", "watch")),
        play("Collect", "run", role("collect"), role("firewall", "teardown")),
        play("Summary", "localhost", role("collect", "summary")),
        play("Status", "run", status),
        play("Stop", "run", role("torchrun", "stop")),
    ])


def record(root, name):
    """Every event of one real run of the small playbook, as ansible-runner hands them over."""
    (root / "code").mkdir()
    (root / "code" / "train.py").write_text("print('hi')\n")
    for path, text in role_files(root, name).items():
        (root / "project" / "roles" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "project" / "roles" / path).write_text(text)
    (root / "project" / "pb.yml").write_text(playbook(name))
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts").write_text("".join(
        f"{host} ansible_connection=local ansible_python_interpreter={sys.executable} "
        f"node_root={root / 'node'}\n" for host in ("localhost",) + NODES))
    events = []
    result = ansible_runner.run(
        private_data_dir=str(root), playbook="pb.yml", quiet=True,
        envvars={"ANSIBLE_COLLECTIONS_PATH": str(shipped_collections_path()),
                 "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])},
        event_handler=lambda event: events.append(event) or False,
        settings={"suppress_ansible_output": True})
    assert result.status == "successful", [
        e["event_data"].get("res") for e in events if e["event"] == "runner_on_failed"]
    return events


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    return record(tmp_path_factory.mktemp("run"), lambda text: text)


def fold(events, progress=None):
    progress = progress or Progress("torchherd launch r1")
    return progress, [line for event in events for line in progress.update(event)]


def phase_lines(lines):
    return [line.removeprefix("torchherd: ") for line in lines if line.count(":") == 1]


def task_event(events, kind, role, module, host, task_file="main.yml"):
    """A recorded event of one task (by role, task file and module, not by its name), copied."""
    return copy.deepcopy(next(
        e for e in events if e["event"] == kind and e["event_data"].get("host") == host
        and e["event_data"].get("role", "") == role
        and f"/{task_file}:" in e["event_data"].get("task_path", "")
        and e["event_data"].get("resolved_action") == module))


def facts_event(events, host, **res):
    """A host's recorded node_facts answer in preflight, with these fields in its result."""
    event = task_event(events, "runner_on_ok", "preflight", "torchherd.cluster.node_facts", host)
    event["event_data"]["res"].update(res)
    return event


def test_phases_come_from_modules_and_roles(events):
    _, lines = fold(events)
    assert phase_lines(lines) == ["plan", "preflight", "sync", "firewall", "start", "watch",
                                  "collect", "teardown", "summary", "status", "stop"]


def test_renamed_tasks_and_plays_give_the_same_phases_and_rows(events, tmp_path):
    renamed = record(tmp_path, lambda text: f"Renamed {text[::-1]}")
    assert {e["event_data"].get("task") for e in renamed} & {
        e["event_data"].get("task") for e in events} <= {None}
    first, lines = fold(events)
    second, renamed_lines = fold(renamed)
    # Hosts answer in any order; the phases come in one.
    assert phase_lines(renamed_lines) == phase_lines(lines)
    assert sorted(renamed_lines) == sorted(lines)
    assert second.rows == first.rows


def test_events_fold_into_rows_and_plain_lines(events):
    progress, lines = fold(events)
    assert list(progress.rows) == ["n0", "n1"]
    assert progress.rows["n0"].rank == "0" and progress.rows["n1"].rank == "1"
    assert progress.nproc == 2 and progress.static
    assert "torchherd: n1 (node_rank 1): checked" in lines
    assert "torchherd: n1 (node_rank 1): synced" in lines
    # The job never ran: every state after the start is the module's own word for that.
    assert (progress.rows["n1"].phase, progress.rows["n1"].state) == ("stop", "absent")
    # The plan's set_fact holds a secret value; no line shows it.
    assert not any("s3cret" in line for line in lines)
    # The preflight role's table, failing where the gate found a problem, restates the gate:
    # not a failure of its host.
    fail = task_event(events, "runner_on_ok", "preflight", "ansible.builtin.debug", "n0")
    fail["event"] = "runner_on_failed"
    fail["event_data"]["res"] = {"failed": True, "msg": "preflight failed, the job was not started"}
    assert Progress().update(fail) == []


def test_a_failed_watch_names_the_job_state_and_the_rank(events):
    watch = next(i for i, e in enumerate(events) if phase_of(e["event_data"], "") == "watch")
    progress, _ = fold(events[:watch + 1])
    wait = task_event(events, "runner_on_ok", "torchrun", "torchherd.cluster.torchrun_job",
                      "n1", "wait.yml")
    retry, failed = copy.deepcopy(wait), wait
    retry["event"] = "runner_retry"
    retry["event_data"]["res"].update(job_state="running", last_line="[default1]:step 7")
    failed["event"] = "runner_on_failed"
    failed["event_data"]["res"].update(job_state="failed", last_line="[default1]:boom")
    assert progress.update(retry) == ["torchherd: n1 (node_rank 1): running: r3: step 7"]
    # A retry that changes nothing prints nothing: no line per watch round.
    assert progress.update(retry) == []
    assert progress.update(failed) == ["torchherd: n1 (node_rank 1): failed: r3: boom"]
    row = progress.rows["n1"]
    assert (row.phase, row.state, row.note) == ("watch", "failed", "r3: boom")


def test_unreachable_and_gate_problems(events):
    plan = [e for e in events if e["event_data"].get("role") == "plan"]
    facts_start = task_event(events, "playbook_on_task_start", "preflight",
                             "torchherd.cluster.node_facts", None)
    progress, _ = fold(plan + [facts_start], Progress())
    facts = task_event(events, "runner_on_ok", "preflight", "torchherd.cluster.node_facts",
                       "n1")
    facts["event"] = "runner_on_unreachable"
    facts["event_data"]["res"] = {"msg": "ssh: connect refused\nmore", "unreachable": True}
    assert progress.update(facts) == [
        "torchherd: n1 (node_rank 1): unreachable: ssh: connect refused"]
    gate = task_event(events, "runner_on_ok", "preflight", "ansible.builtin.set_fact", "n0")
    gate["event_data"]["res"]["ansible_facts"]["torchherd_gate"].update(ok=False, problems=[
        {"host": "n0", "check": "gpus", "expected": ">= 2", "found": "0"}])
    progress.update(gate)
    assert (progress.rows["n0"].phase, progress.rows["n0"].state) == (
        "preflight", "preflight failed")
    assert progress.rows["n0"].note == "gpus: found 0"


def test_summary_sets_final_states_and_the_table_renders(events):
    progress, _ = fold(events[:2], Progress("t"))
    summary = task_event(events, "runner_on_ok", "collect", "torchherd.cluster.run_summary",
                         "localhost", "summary.yml")
    summary["event_data"]["res"]["summary"].update(nproc_per_node=2, hosts={
        "n0": {"node_rank": 0, "state": "succeeded", "last_line": "[default1]:done"},
        "n1": {"node_rank": 1, "state": "failed", "exception": "RuntimeError: x"}})
    assert progress.update(summary) == ["torchherd: n0 (node_rank 0): succeeded: r1: done",
                                        "torchherd: n1 (node_rank 1): failed: RuntimeError: x"]
    console = Console(width=120, record=True)
    console.print(progress.table())
    text = console.export_text()
    assert "n1" in text and "RuntimeError: x" in text and "succeeded" in text


def test_a_module_serving_several_phases_is_told_apart_by_role_and_task_file():
    torchrun = {"resolved_action": "torchherd.cluster.torchrun_job", "role": "torchrun"}
    assert phase_of({**torchrun, "task_path": "/r/torchrun/tasks/start.yml:3"}, "") == "start"
    assert phase_of({**torchrun, "task_path": "/r/torchrun/tasks/wait.yml:3"}, "") == "watch"
    assert phase_of({"resolved_action": "torchherd.cluster.torchrun_job"}, "") == "status"
    assert phase_of({"resolved_action": "ansible.builtin.assert", "role": "torchrun"},
                    "sync") == "sync"


@pytest.mark.parametrize("raw,shown", [
    ("[default0]:epoch 3 loss 0.12", True),
    ("[default1]:[rank3]:step 7", True),
    # torch's and Python's warnings, from a rank or from torchrun itself
    ("[default0]:/x/torch/distributed/c10d.py:12: UserWarning: barrier() device unknown", False),
    ("[default0]:  warnings.warn(", False),
    ("[default0]:[W1125 18:05:51.123 ProcessGroupGloo.cpp:727] Warning: Unable to resolve",
     False),
    ("W1125 18:05:51.123000 4242 torch/distributed/run.py:793] ", False),
    ("WARNING:torch.distributed.run:", False),
    ("*****************************************", False),
    ("Setting OMP_NUM_THREADS environment variable for each process to be 1 in default", False),
    ("[default0]:   ", False),
    # a launcher without torchrun's prefixes (DeepSpeed): its ranks' lines are shown too
    ("loss 0.5", True),
])
def test_the_job_line_filter(raw, shown):
    assert job_line(parse_line("n0", 0, 2, raw)) is shown


@pytest.mark.parametrize("seconds,text", [
    (None, ""), (-1, "0s"), (0.4, "0s"), (59.9, "59s"), (60, "1m00s"), (185, "3m05s"),
    (3599, "59m59s"), (3600, "1h00m"), (7265, "2h01m"), (90061, "25h01m"),
])
def test_elapsed_times(seconds, text):
    assert elapsed(seconds) == text


def test_row_cells_count_from_the_start_until_the_end():
    row = Row(rank="1", phase="watch", state="running", note="r3: [x]", started=100.0)
    assert row_cells("n[b]", row, 165.5) == [
        "n\\[b]", "1", "watch", "[cyan]running[/]", "1m05s", "r3: \\[x]"]
    row.ended = 110.0
    assert row_cells("n1", row, 9999.0)[4] == "10s"
    assert row_cells("n1", Row(state="planned"), 1.0)[3:5] == ["planned", ""]


def test_a_running_job_shows_time_and_the_last_line_a_rank_printed(events):
    """The watch's rounds (runner_retry) bring the node's last log line: the table shows the
    job's words, keeps them over torchrun's and torch's own, and counts the time."""
    watch = next(i for i, e in enumerate(events) if phase_of(e["event_data"], "") == "watch")
    progress = Progress("t", now=0.0)
    start = task_event(events, "runner_on_ok", "torchrun", "torchherd.cluster.torchrun_job",
                       "n0", "start.yml")
    for event in events[:watch]:
        progress.update(event, now=10.0)
    # The recorded start only read the state (the job never ran): as a start that ran it.
    running = copy.deepcopy(start)
    running["event_data"]["res"].update(job_state="running", last_line="")
    progress.update(running, now=10.0)
    assert progress.rows["n0"].phase == "start"
    progress.update(events[watch], now=11.0)  # the watch's task starts
    assert progress.rows["n0"].phase == "watch"
    wait = task_event(events, "runner_on_ok", "torchrun", "torchherd.cluster.torchrun_job",
                      "n0", "wait.yml")
    wait["event"] = "runner_retry"

    def round_(line, now):
        retry = copy.deepcopy(wait)
        retry["event_data"]["res"].update(job_state="running", last_line=line)
        progress.update(retry, now=now)
        return progress.rows["n0"].note

    assert round_("*****************************************", 15.0) == ""
    assert round_("[default1]:tick 3/16", 20.0) == "r1: tick 3/16"
    assert round_("[default0]:/t.py:3: UserWarning: careful", 25.0) == "r1: tick 3/16"
    assert round_("torchrun agent says hello", 27.0) == "r1: tick 3/16"
    assert round_("[default0]:tick 9/16", 30.0) == "r0: tick 9/16"
    console = Console(width=120, record=True)
    console.print(progress.table(now=75.0))
    text = console.export_text()
    assert "r0: tick 9/16" in text and "1m05s" in text  # since the start on n0
    assert "t: watch  1m15s" in text  # since the run began
    ended = copy.deepcopy(wait)
    ended["event_data"]["res"].update(job_state="succeeded", last_line="[default0]:done")
    progress.update(ended, now=40.0)
    assert row_cells("n0", progress.rows["n0"], 500.0)[4:] == ["30s", "r0: done"]


def test_the_masters_wait_gives_every_node_its_own_last_line(events):
    """Where the master's wait speaks for its gang, its rounds carry every node's last line as
    the gang heard it (``nodes``): each running node's row shows its own, ranked as its own;
    the master's row keeps its log's line where that is the job's, else takes the gang's."""
    watch = next(i for i, e in enumerate(events) if phase_of(e["event_data"], "") == "watch")
    progress = Progress("t", now=0.0)
    for event in events[:watch]:
        progress.update(event, now=10.0)
    for host in NODES:
        start = task_event(events, "runner_on_ok", "torchrun", "torchherd.cluster.torchrun_job",
                           host, "start.yml")
        start["event_data"]["res"].update(job_state="running", last_line="")
        progress.update(start, now=10.0)
    progress.update(events[watch], now=11.0)
    wait = task_event(events, "runner_on_ok", "torchrun", "torchherd.cluster.torchrun_job",
                      "n0", "wait.yml")
    wait["event"] = "runner_retry"

    def round_(own, nodes, now):
        retry = copy.deepcopy(wait)
        retry["event_data"]["res"].update(job_state="running", last_line=own, nodes=nodes,
                                          gang_complete=True, gang_ended=False)
        assert progress.update(retry, now=now) == []  # lines every second: nothing printed
        return [progress.rows[h].note for h in NODES]

    said = {"n0": {"last_line": "[default1]:step 4", "at": 1.0},
            "n1": {"last_line": "[default0]:step 5", "at": 1.2}}
    # n1 is node_rank 1 of 2 processes a node: its local rank 0 is rank 2.
    assert round_("[default0]:step 6", said, 15.0) == ["r0: step 6", "r2: step 5"]
    # The master's log ends in a warning: the gang's line of it is the job's.
    assert round_("[default0]:/t.py:3: UserWarning: careful", said, 16.0) == [
        "r1: step 4", "r2: step 5"]
    # A torch warning a node said keeps the rank's line it showed; anything but a mapping or
    # a node of no row is passed over.
    assert round_("", {"n1": {"last_line": "W1128 10:00:00.1 1 x.py:1] slow"}, "n9": {},
                       "n0": "?"}, 17.0) == ["r1: step 4", "r2: step 5"]
    assert round_("", "not a mapping", 18.0) == ["r1: step 4", "r2: step 5"]
    # A node whose row no longer runs keeps its last note.
    progress.rows["n1"].state = "failed"
    assert round_("", {"n1": {"last_line": "[default0]:later"}}, 19.0)[1] == "r2: step 5"
    console = Console(width=120, record=True)
    progress.rows["n1"].state = "running"
    console.print(progress.table(now=40.0))
    text = console.export_text()
    assert "r1: step 4" in text and "r2: step 5" in text and text.count("30s") == 2
    assert " use " not in text  # nothing sampled yet: no column
    # Each node's use rides beside its line (its last sample's cell); the master's own answer
    # carries its record's too.
    retry = copy.deepcopy(wait)
    retry["event_data"]["res"].update(
        job_state="running", last_line="", gang_complete=True, gang_ended=False,
        record={"use": {"now": "gpu 97% 39.3G"}},
        nodes={"n1": {"last_line": "[default0]:step 7", "at": 2.0, "use": "gpu 3% 1.0G"}})
    progress.update(retry, now=41.0)
    assert [progress.rows[h].use for h in NODES] == ["gpu 97% 39.3G", "gpu 3% 1.0G"]
    console = Console(width=160, record=True)
    console.print(progress.table(now=42.0))
    text = console.export_text()
    assert " use " in text and "gpu 97% 39.3G" in text and "gpu 3% 1.0G" in text
    # n1's GPUs sat idle while n0's worked (the gang's idle_for): said once, shown in its cell.
    retry["event_data"]["res"]["nodes"]["n1"].update(use="gpu 0% 1.0G", idle_for=16.0)
    assert progress.update(retry, now=43.0) == [
        "n1: its GPUs sit idle (16s) while the other nodes' GPUs work: a straggler or a stuck "
        "rank?"]
    assert progress.rows["n1"].use == "gpu 0% 1.0G, idle 16s"
    retry["event_data"]["res"]["nodes"]["n1"]["idle_for"] = 21.0
    assert progress.update(retry, now=48.0) == []
    assert progress.rows["n1"].use == "gpu 0% 1.0G, idle 21s"


def test_facts_cells_of_a_gpu_node_and_a_node_that_failed():
    gpu = {"node_rank": 0, "role": "master", "check": "passed", "failed_checks": [],
           "python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9",
           "gpus": [{"name": "NVIDIA H100 80GB HBM3", "nics": ["mlx5_0"], "link": "PIX"},
                    {"name": "NVIDIA H100 80GB HBM3", "nics": [], "link": None}] * 4,
           "launchers": {"accelerate": "1.15.0", "deepspeed": None},
           "interface": {"name": "ib0", "address": "10.0.0.1", "how": "explicit"},
           "disk_free_bytes": 68660191232, "shm_bytes": 64 << 20,
           "rdma": ["mlx5_0:1 ACTIVE", "mlx5_1:1 DOWN"],
           "warned_checks": ["persistence mode", "shm"]}
    assert facts_cells("gpu0", gpu) == [
        "gpu0", "0 master", "3.12.3", "2.11.0+cu130", "13.0", "2.28.9",
        "8 x NVIDIA H100 80GB HBM3", "accelerate 1.15.0", "ib0 10.0.0.1", "63.9 GiB",
        "0.1 GiB", "mlx5_0:1 ACTIVE, mlx5_1:1 DOWN; gpu0 mlx5_0 PIX, gpu2 mlx5_0 PIX, "
        "gpu4 mlx5_0 PIX, gpu6 mlx5_0 PIX",
        "[green]passed; warned: persistence mode, shm[/]"]
    lost = {"node_rank": None, "role": "worker", "check": "unreachable",
            "failed_checks": ["ssh"], "gpus": [], "launchers": {}, "interface": None,
            "disk_free_bytes": None}
    assert facts_cells("n9", lost) == [
        "n9", "worker", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
        "[red]unreachable: ssh[/]"]
    assert gpus_text([]) == "cpu"
    assert gpus_text([{"name": "A"}, {"name": "B"}, {"name": "A"}]) == "2 x A, 1 x B"


def test_facts_cells_say_where_the_job_runs_in_a_locked_venv():
    node = {"node_rank": 1, "role": "worker", "check": "passed", "python": "3.11.2",
            "torch": "2.13.0+cpu", "gpus": [], "launchers": {}}
    made = dict(node, venv={"path": "/root/.torchherd/venvs/k", "made": True, "seconds": 8.04})
    assert facts_cells("n1", made)[2] == "3.11.2 venv made 8.0 s"
    reused = dict(node, venv={"path": "/root/.torchherd/venvs/k", "made": False, "seconds": 0.0})
    assert facts_cells("n1", reused)[2] == "3.11.2 venv"
    assert facts_cells("n1", node)[2] == "3.11.2"


def test_the_verify_cell_and_the_preflight_line_say_where_the_image_came_from(events):
    node = {"node_rank": 1, "role": "worker", "check": "passed", "python": "3.11.2",
            "torch": "2.13.0+cpu", "gpus": [], "launchers": {}}
    pulled = {"runtime": "podman", "image": "img:1", "pulled": True, "seconds": 41.26}
    assert facts_cells("n1", dict(node, container=pulled))[2] == "3.11.2 in image, pulled 41.3 s"
    assert facts_cells("n1", dict(node, container=dict(pulled, pulled=False)))[2] == \
        "3.11.2 in image"
    progress = Progress()
    assert progress.update(facts_event(events, "n0", container=pulled)) == [
        "torchherd: n0: checked: image pulled in 41.3 s"]
    found = dict(pulled, pulled=False)
    assert progress.update(facts_event(events, "n1", container=found)) == [
        "torchherd: n1: checked: image found"]
    missing = dict(pulled, error="no runtime")
    assert Progress().update(facts_event(events, "n1", container=missing)) == [
        "torchherd: n1: checked"]


def test_a_nodes_preflight_says_whether_it_made_the_jobs_venv(events):
    progress = Progress()
    assert progress.update(facts_event(events, "n0", venv={"made": True, "seconds": 8.04})) == [
        "torchherd: n0: checked: venv made in 8.0 s"]
    assert progress.update(facts_event(events, "n1", venv={"made": False, "seconds": 0.001})) == [
        "torchherd: n1: checked: venv reused"]
    fresh = Progress()
    assert fresh.update(facts_event(events, "n1", venv=None)) == ["torchherd: n1: checked"]
    # The note is the preflight line's: the job's own state does not carry it on.
    started = task_event(events, "runner_on_ok", "torchrun", "torchherd.cluster.torchrun_job",
                         "n0", "start.yml")
    started["event_data"]["res"]["last_line"] = ""
    assert all("venv" not in line for line in progress.update(started))
    assert progress.rows["n0"].note == ""


def test_a_launch_in_waves_says_so_in_the_title_and_a_line(events):
    def schedule(waves, why):
        return {"event": "runner_on_ok", "event_data": {
            "host": "localhost", "role": "plan", "resolved_action": "ansible.builtin.set_fact",
            "res": {"ansible_facts": {"torchherd_schedule": {"waves": waves,
                                                             "why": {"waves": why}}}}}}

    one, _ = fold(events)
    assert one.update(schedule(1, "one worker per node (64 forks for 2 nodes)")) == []
    assert "waves" not in one.table(now=one.began + 5).build(120).title
    progress = Progress("torchherd launch r1")
    said = progress.update(schedule(7, "5 forks for 32 nodes: each task runs in 7 waves"))
    assert said == ["the launch runs in waves: 5 forks for 32 nodes: each task runs in 7 waves"]
    fold(events, progress)
    title = progress.table(now=progress.began + 5).build(120).title
    assert title.endswith("(7 waves)"), title


def test_a_relaunchs_start_with_its_facts_shows_the_job_running_at_once(events):
    """Where the start came with the facts call (the schedule's start.with_facts) and went on,
    the node's row is its job's from that answer on: running, timed from then."""
    progress = Progress()
    said = progress.update(facts_event(events, "n0", start={
        "started": True, "job_state": "running", "last_line": "", "meta": {"node_rank": 0}}))
    row = progress.rows["n0"]
    assert (row.state, row.phase, row.rank) == ("running", "start", "0"), said
    assert row.started is not None
    # Called off (a node refused): the row is the preflight's, as on the full path.
    fresh = Progress()
    assert fresh.update(facts_event(events, "n1", start={
        "started": False, "job_state": "absent"})) == ["torchherd: n1: checked"]
