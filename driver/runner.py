"""ansible-runner underneath: a fresh private data dir per call, extra vars through a pipe,
events.

Extra vars (the job, secret_env among them) reach ansible-playbook through a named pipe in the
private data dir (0700), which it reads once with ``-e @path``: they never show on a command
line (/proc/*/cmdline is world-readable) and are on no disk. ansible-runner's own record of the
command and the driver's environment (``artifacts/<ident>/command``) goes into a pipe that is
read and dropped (driver.pipes). The directory holds nothing else of the caller's while a run
lasts, and is removed afterwards.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from driver.ansible_options import limit_flags, passwords, prompt_answers
from driver.paths import collections_env, driver_version, playbook
from driver.pipes import drained, handed_over

Event = dict[str, Any]

# How often ansible-runner looks at the cancel callback: the latency of Ctrl-C, and while a
# job is watched nearly all the controller does (each look costs ~0.4 ms of CPU).
_POLL_SECONDS = 1.0


@dataclass
class Outcome:
    """What ansible-runner reported: its status, return code, per-host stats and failures."""

    status: str
    rc: int
    stats: dict[str, Any] = field(default_factory=dict)
    failures: list[Event] = field(default_factory=list)
    # Ansible's own errors outside any task (an inventory that does not parse, a syntax error),
    # which reach ansible-runner as plain output lines.
    errors: list[str] = field(default_factory=list)

    @property
    def cancelled(self) -> bool:
        return self.status == "canceled"

    def hosts_with(self, key: str) -> list[str]:
        return sorted(h for h, n in (self.stats.get(key) or {}).items() if n)


def secret_values(data: Any) -> list[str]:
    """Every value of every ``secret_env`` mapping in ``data``, longest first."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "secret_env" and isinstance(value, dict):
                found += [str(v) for v in value.values() if str(v)]
            else:
                found += secret_values(value)
    elif isinstance(data, list):
        for value in data:
            found += secret_values(value)
    return sorted(set(found), key=len, reverse=True)


def scrub(data: Any, hidden: list[str]) -> Any:
    """A copy of ``data`` with each hidden value replaced by ``********`` in every string."""
    if not hidden:
        return data
    if isinstance(data, str):
        for value in hidden:
            data = data.replace(value, "********")
        return data
    if isinstance(data, dict):
        return {scrub(k, hidden): scrub(v, hidden) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub(v, hidden) for v in data]
    return data


_ERROR_LINE = re.compile(r"^\s*(?:\[ERROR\]:|ERROR!)\s*")
_PARSE_FAILED = re.compile(r"\[WARNING\]: (Failed to parse inventory with '\w+' plugin: .*)")

# What a launch needs of Ansible, set per run. Each is an environment variable that ansible-core
# reads, set only where the caller's environment does not set it already; everything else comes
# from the caller's own Ansible configuration, as for any ansible-playbook run.
RUN_SETTINGS = {
    # Modules through SSH's stdin, not copied: one connection per task.
    "ANSIBLE_PIPELINING": "True",
    # An inventory that does not parse is an error, not an empty node group.
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
    "ANSIBLE_NOCOLOR": "1",
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
}
# Added to every SSH command line, after the caller's ssh_args and ssh_common_args (ssh keeps
# the first value it sees of an option, so the caller's own win). Keep-alives: a node that
# dies mid-run is declared unreachable within ~10 s, not after TCP's minutes. BatchMode: no
# prompt can hang a run (an unknown host key fails, and the driver says how to fix it).
SSH_EXTRA_ARGS = ("-o", "ServerAliveInterval=3", "-o", "ServerAliveCountMax=3",
                  "-o", "BatchMode=yes")
# verify's probe, the interconnect check, the hang watch and ps run a task on every node at once.
# ansible-core starts no more workers than a play has hosts, so this is "one fork per node",
# whatever the count. A launch takes the forks of the caller's Ansible configuration instead
# (forks; 5 where none is set): with fewer forks than nodes its start barrier runs in the
# background and the nodes stop each other after a failure, so it needs no worker per node.
FORKS = 1024
# The forks of a run whose caller's Ansible configuration sets none (Ansible's default is 5):
# one worker per node, as a launch wants (with 5, 32 nodes take seven waves of every task, each
# a round trip on a real network), up to this bound. A worker is a forked ansible-playbook of
# 30-60 MB of its own; 64 of them fit a small controller (2-4 GB), and ansible-core starts no
# more workers than a play has hosts, so a small cluster pays for none it does not use. Where
# the caller sets forks (ansible.cfg, ANSIBLE_FORKS), theirs hold, and a launch with fewer forks
# than nodes says that it ran in waves.
OWN_FORKS = 64
# The SSH options of a run whose caller's configuration sets no ssh_args (ansible.cfg's
# [ssh_connection], ANSIBLE_SSH_ARGS; a node's ansible_ssh_args still wins): Ansible's own, with
# the connection to each node kept open for ten minutes after its last use instead of Ansible's
# 60 s. A user who edits and relaunches every few minutes then pays no node's SSH handshake
# again (more than one round trip each, more through a bastion). The masters are ssh processes
# on this controller only, under Ansible's ControlPath (the caller's control_path and
# control_path_dir where set); each ends after its idle time, or at once with `torchherd
# disconnect`.
OWN_SSH_ARGS = "-C -o ControlMaster=auto -o ControlPersist=10m"
# What a run needs that no environment variable sets (internal_poll_interval), given where the
# caller has no Ansible configuration at all; a caller's ansible.cfg is theirs to set it in.
OWN_CONFIG = Path(__file__).with_name("ansible.cfg")


def run_settings(environ: Any) -> dict[str, str]:
    """The environment of a run: the settings above where the caller has none, and the way to
    the collection (driver.paths)."""
    from ansible.config.manager import ConfigManager, find_ini_config_file
    env = {k: v for k, v in RUN_SETTINGS.items() if k not in environ}
    # The caller's own Ansible configuration, read as ansible-playbook reads it from this
    # directory.
    config = ConfigManager()
    if "ANSIBLE_HOST_KEY_CHECKING" not in environ:
        # ansible-runner turns host key checking off unless this is set: set it to what the
        # caller's configuration says (on by default).
        checking = config.get_config_value("HOST_KEY_CHECKING")
        env["ANSIBLE_HOST_KEY_CHECKING"] = "True" if checking else "False"
    if "ANSIBLE_FORKS" not in environ and \
            config.get_config_value_and_origin("DEFAULT_FORKS")[1] == "default":
        env["ANSIBLE_FORKS"] = str(OWN_FORKS)
    if "ANSIBLE_SSH_ARGS" not in environ and not _sets_ssh_args(find_ini_config_file()):
        env["ANSIBLE_SSH_ARGS"] = OWN_SSH_ARGS
    if "ANSIBLE_CONFIG" not in environ and find_ini_config_file() is None:
        # No configuration of the caller's: the driver's own, for what has no variable.
        env["ANSIBLE_CONFIG"] = str(OWN_CONFIG)
    env.update(collections_env(dict(environ)))
    # The tools of this interpreter's environment first, as where it is activated.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), environ.get("PATH", "")])
    return env


def _sets_ssh_args(config_file: str | None) -> bool:
    """Whether the caller's Ansible configuration file sets ssh_args (read as Ansible reads
    it; a file that does not parse counts as setting them: theirs, not ours, to decide)."""
    if not config_file:
        return False
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",), interpolation=None)
    try:
        parser.read(config_file, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return True
    return parser.has_option("ssh_connection", "ssh_args")


def _cmdline(all_at_once: bool) -> list[str]:
    extra = " ".join(SSH_EXTRA_ARGS)
    if not all_at_once:
        return [f"--ssh-extra-args={extra}"]
    forks = max(FORKS, int(os.environ.get("ANSIBLE_FORKS", "0") or 0))
    return ["--forks", str(forks), f"--ssh-extra-args={extra}"]


def all_at_once(name: str, extravars: dict[str, Any]) -> bool:
    """Whether playbook `name` runs a task on every node at once (see FORKS): verify and ps
    always; for a launch the collection's schedule decides it (its forks_needed, filter
    torchherd.cluster.schedule); this copy only raises the forks beforehand, and
    tests/unit/plugins/filter/test_schedule.py keeps the two equal."""
    job = extravars.get("torchherd_job") or {}
    return name in ("verify", "ps") or (name == "launch" and isinstance(job, dict) and (
        job.get("interconnect") == "always" or bool(job.get("hang_timeout"))))


# ansible-playbook is this interpreter's (python -m ansible playbook), whichever ansible-playbook
# the PATH has: the same ansible-core as the driver's, and the site-packages where the wheel's
# collection is (a venv made with --system-site-packages has no ansible-playbook of its own, and
# the system's would look for the collection elsewhere). _PLAYBOOK runs it, in its own process
# (no exec):
# - On Linux tied to the driver, so that it does not outlive it: where the driver is killed
#   outright (SIGKILL, the OOM killer, a CI runner's hard timeout), the kernel sends it SIGTERM
#   (the parent-death signal), which ends it and its workers; the job on the nodes goes on, and
#   status tells its state. The parent is checked after the signal is set: a driver that died
#   before would not send it. (ansible-runner's pexpect session ignores SIGHUP: the closed
#   terminal does not end it.) Elsewhere the first argument is "-" and nothing is tied.
# - Without the interpreter's last garbage collection at its exit, which goes over every object
#   ansible-playbook made (about 0.1 s of a launch's controller CPU, after its last task, on the
#   way to the command's return): gc.freeze, registered first so that it runs after Ansible's
#   own exit handlers (its queues, its temporary files), leaves them to the process's end.
_PLAYBOOK = ("# torchherd: ansible-playbook as the driver runs it\n"
             "import atexit, gc, os, runpy, signal, sys\n"
             "atexit.register(gc.freeze)\n"
             "if sys.argv[1] != '-':\n"
             "    import ctypes\n"
             "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
             "    if os.getppid() != int(sys.argv[1]):\n"
             "        sys.exit(128 + signal.SIGTERM)\n"
             "del sys.argv[1]\n"
             "runpy.run_module('ansible', run_name='__main__', alter_sys=True)\n")


def _ansible_playbook(name: str) -> tuple[str, list[str]]:
    """ansible-runner's ``binary`` and the arguments before ansible-playbook's own options:
    this interpreter's ansible-playbook running playbook ``name`` (_PLAYBOOK), tied to this
    process where the system has a parent-death signal (Linux)."""
    tie = str(os.getpid()) if sys.platform.startswith("linux") else "-"
    return sys.executable, ["-c", _PLAYBOOK, tie, "playbook", playbook(name)]


def run_playbook(
    name: str,
    inventory: str | Path,
    extravars: dict[str, Any],
    on_event: Callable[[Event], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    verbosity: int = 0,
) -> Outcome:
    """Run one of the collection's playbooks and wait for it.

    ``on_event`` gets every ansible-runner event (in this thread), with the values of
    secret_env replaced wherever they appear (a second layer: the plan holds secret names only
    and the start task is no_log, but the values pass through the start task's arguments).
    ``cancelled`` is polled a
    few times a second; once it returns True the playbook is killed and the outcome's status
    is ``canceled``. Passing it also keeps ansible-runner's own SIGINT handler out of the way.
    """
    private = Path(tempfile.mkdtemp(prefix="torchherd-runner-"))  # 0700
    failures: list[Event] = []
    errors: list[str] = []
    parse_failures: list[str] = []
    stats: dict[str, Any] = {}
    hidden = sorted({*secret_values(extravars), *passwords()}, key=len, reverse=True)
    asking, answers = prompt_answers()

    def handle(event: Event) -> bool:
        event = scrub(event, hidden)
        kind = event.get("event")
        data = event.get("event_data", {})
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get(
                "ignore_errors"):
            failures.append(event)
        elif kind == "verbose" and _ERROR_LINE.match(event.get("stdout") or ""):
            errors.append(_ERROR_LINE.sub("", event["stdout"]).strip())
        elif kind == "verbose" and _PARSE_FAILED.search(event.get("stdout") or ""):
            parse_failures.append(_PARSE_FAILED.search(event["stdout"]).group(1).strip())
        elif kind == "playbook_on_stats":
            stats.update({k: data.get(k) or {} for k in (
                "ok", "dark", "failures", "ignored", "rescued", "skipped", "changed")})
        if on_event:
            on_event(event)
        # False: ansible-runner keeps no copy of the events on disk (a second layer against a
        # secret value that some result might carry).
        return False

    env = run_settings(os.environ)
    version = driver_version()
    ident = uuid.uuid4().hex
    binary, leading = _ansible_playbook(name)
    try:
        with contextlib.ExitStack() as pipes:
            extravars_pipe = pipes.enter_context(handed_over(
                private / "extravars",
                {**extravars, **({"torchherd_driver_version": version} if version else {}),
                 # The driver shows the summary's table itself: the playbook's own table task
                 # runs only where the run failed.
                 "torchherd_summary_show": False}))
            pipes.enter_context(drained(private / "artifacts" / ident / "command"))
            result = ansible_runner.run(
                private_data_dir=str(private),
                ident=ident,
                # Ansible runs in the caller's directory, so it finds the caller's ./ansible.cfg
                # (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg, as
                # ansible-playbook would) and resolves relative paths in the job as the caller
                # means.
                project_dir=os.getcwd(),
                playbook=playbook(name),
                binary=binary,
                # A list of sources goes to ansible-playbook's -i as given: an inline host list
                # (node1,node2,) is then read by Ansible's own host_list plugin. A plain string
                # would be written to a file and read as INI: one host named "node1,node2,".
                inventory=[str(inventory)],  # driver.inputs.inventory_source made it absolute
                envvars=env,
                cmdline=shlex.join([*leading, *_cmdline(all_at_once(name, extravars)),
                                    *asking, *limit_flags(), "-e", f"@{extravars_pipe}"]),
                # The passwords asked for (-K, -J), answered to ansible-playbook's own prompts
                # through its terminal: in no file, no environment, no command line.
                passwords=answers,
                quiet=True,
                verbosity=verbosity or None,
                event_handler=handle,
                # Our own callback: without one ansible-runner installs its own SIGINT handler
                # (ansible-runner issue 1075) and Ctrl-C no longer reaches the caller.
                cancel_callback=cancelled,
                # No stdout file either: at higher verbosity it would hold task results.
                settings={"suppress_ansible_output": True, "suppress_output_file": True,
                          "job_timeout": 0, "pexpect_timeout": _POLL_SECONDS},
            )
        if any(e.startswith("No inventory was parsed") for e in errors):
            errors.insert(0, f"inventory {inventory}: expected an inventory that Ansible can "
                          f"parse, found: {'; '.join(parse_failures) or 'no plugin could'}; fix: "
                          f"correct it (ansible-inventory -i {inventory} --graph shows what "
                          f"Ansible reads)")
        return Outcome(status=result.status, rc=result.rc, stats=stats, failures=failures,
                       errors=errors)
    finally:
        # Nothing of the caller's is in it by now; it is this run's, and goes with it.
        shutil.rmtree(private, ignore_errors=True)
