"""docs/first-hour.md as a new user lives it: every command of its ``console`` blocks, in the
page's order, in one shell (so ``cd``, ``. activate`` and variables carry over) in a fresh
directory holding the wheel built from this checkout; each command exits as the page says
(a ``# exit N`` line among its output, else 0) and prints the lines CHECKS names, which the
page must show too. Every other line the page shows for a torchherd command (or a file it
ships) is in the real output as well, with what changes every run masked (``shown_lines``;
``...`` on a line of its own stands for lines left out): the page's output is today's
code's, not a paste that drifted.

The page's nodes are this machine (inventories/local.ini); their job needs a Python with torch,
which the page takes from $NODE_PYTHON: here the suite's own, as a user's would be theirs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from driver.paths import CHECKOUT
from tests.integration.local_nodes import NODE_ROOTS
from tests.integration.test_install import _clean_env

pytestmark = pytest.mark.cluster

DOC = CHECKOUT / "docs" / "first-hour.md"

# Every command of the page in order, with phrases that must be in the page's output of it and
# in the real one: none with a run id, a time, a size or a path, which change every run.
CHECKS: list[tuple[str, list[str]]] = [
    ("python3 -m venv torchherd-venv", []),
    (". torchherd-venv/bin/activate", []),
    ("pip install ./torchherd-*.whl", ["Successfully installed"]),
    ("torchherd --version", ["torchherd "]),
    ("torchherd init first-hour", ["wrote a job file, inventories and examples",
                                   "first-hour/job.yml", "first-hour/inventories/cluster.ini",
                                   "first-hour/examples/allreduce.py"]),
    ("cd first-hour", []),
    ("cat inventories/local.ini", ["node0 ansible_host=127.0.0.1",
                                   "ansible_python_interpreter={{ ansible_playbook_python }}"]),
    ("torchherd verify -i inventories/local.ini -j job.yml",
     ["the nodes as preflight found them", "failed: torch", "No module named 'torch'",
      "set torchherd_job.python to the venv that has it", "preflight_failed"]),
    ('echo "  python: $NODE_PYTHON" >> job.yml', []),
    ("torchherd verify -i inventories/local.ini -j job.yml",
     ["the nodes as preflight found them", "│ node0 │ 0 master │", "│ node1 │ 1 worker │",
      "verified: every check passed"]),
    ("torchherd launch -i inventories/local.ini -j job.yml",
     ["torchherd-allreduce ok", "sum=6 expected=6", "succeeded: every node exited 0"]),
    ("torchherd launch -i inventories/local.ini -j job.yml -- allreduce.py --fail-rank 3",
     ["failed: RuntimeError: injected failure on rank 3",
      "failed: node node1 (node_rank 1) rank 3: RuntimeError: injected failure on rank 3"]),
    ("torchherd runs", ["preflight_failed", "verified", "every check passed",
                        "every node exited 0", "RuntimeError: injected failure on rank 3"]),
    ("run=$(ls runs | tail -n 1)", []),
    ("torchherd logs $run", ["node1 r3: torchherd-fail rank=3",
                             "node1 r3: RuntimeError: injected failure on rank 3"]),
    ("torchherd runs --prune --keep 1 -i inventories/local.ini",
     ["would remove 3 runs", "and 2 run directories on nodes", "dry run: nothing was removed"]),
    ("torchherd runs --prune --keep 1 -i inventories/local.ini --yes",
     ["removed 3 runs", "and 2 run directories on nodes"]),
    ("torchherd runs", ["failed", "RuntimeError: injected failure on rank 3"]),
]


@dataclass
class Step:
    command: str
    shown: list[str] = field(default_factory=list)  # the page's output lines of it
    exit_code: int = 0


def steps_of(text: str) -> list[Step]:
    """The commands of the page's ``console`` blocks (lines starting with ``$ ``), each with
    the lines shown after it and its ``# exit N``."""
    steps: list[Step] = []
    for block in re.findall(r"^```console\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append(Step(line[2:]))
            elif steps and (code := re.fullmatch(r"# exit (\d+)", line.strip())):
                steps[-1].exit_code = int(code.group(1))
            elif steps:
                steps[-1].shown.append(line)
    return steps


# The page's homes: /home/demo is the new user's (the test's fresh directory), /home/me the
# home of the user whose local nodes run the job (their roots are under ~/.torchherd/local).
PAGE_HOME, PAGE_NODES_HOME = "/home/demo", "/home/me"
_RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b")
_SIZE = re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)\b")
_ELAPSED = re.compile(r"\b\d+(?:h\d+m|m\d+s|s)\b")
_RULE = re.compile(r"([━─═])\1+")


def shown_lines(text: str, home: Path) -> set[str]:
    """The lines of ``text`` as the page and a real run can both show them: the page's homes in
    place of the real ones; run ids, sizes, times, host names and every other number masked
    (which rank printed last, a pid, a version); spaces and table rules collapsed (a column is
    as wide as its widest cell)."""
    lines = set()
    for line in text.splitlines():
        line = line.replace(str(home), PAGE_HOME).replace(str(Path.home()), PAGE_NODES_HOME)
        line = _RUN_ID.sub("RUN", line)
        line = _SIZE.sub("SIZE", line)
        line = _ELAPSED.sub("TIME", line)
        line = re.sub(r"host=\S+", "host=HOST", line)
        line = re.sub(r"\d+", "N", line)
        line = " ".join(_RULE.sub(r"\1", line).split())
        if line and line != "...":
            lines.add(line)
    return lines


def run_in_one_shell(commands: list[str], cwd: Path, env: dict[str, str],
                     timeout: float) -> list[tuple[int, str]]:
    """(exit code, stdout and stderr together) of each command, run one after another by one
    bash, as typed at a prompt."""
    record = cwd.parent / "shell"
    record.mkdir()
    script = []
    for i, command in enumerate(commands):
        (record / f"{i}.cmd").write_text(command, encoding="utf-8")
        script.append(f'eval "$(cat {record}/{i}.cmd)" </dev/null >{record}/{i}.out 2>&1; '
                      f"echo $? >{record}/{i}.rc")
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, check=True,
                   timeout=timeout)
    return [(int((record / f"{i}.rc").read_text()),
             (record / f"{i}.out").read_text(encoding="utf-8", errors="replace"))
            for i in range(len(commands))]


def test_the_first_hour_page_runs_as_shown(wheel, tmp_path):
    steps = steps_of(DOC.read_text(encoding="utf-8"))
    assert [s.command for s in steps] == [c for c, _ in CHECKS], "the page's commands changed"
    home = tmp_path / "home"
    home.mkdir()
    # The wheel of this checkout, where the page's `pip install` finds it.
    shutil.copy(wheel, home)
    # A shell with no venv active: python3 is the suite's interpreter (not its venv), so the
    # page's venv has no torch, as a new user's has not. Its PATH: that bin/, then the system's.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    env = _clean_env(tmp_path)
    env["NODE_PYTHON"] = sys.executable
    try:
        results = run_in_one_shell([s.command for s in steps], home, env, timeout=900)
        for step, (_command, phrases), (rc, out) in zip(steps, CHECKS, results, strict=True):
            assert rc == step.exit_code, (step.command, rc, out[-3000:])
            shown = "\n".join(step.shown)
            for phrase in phrases:
                assert phrase in shown, (step.command, f"the page does not show {phrase!r}")
                assert phrase in out, (step.command, phrase, out[-3000:])
            # What torchherd prints, and the files it ships (pip's words are pip's).
            if not step.command.startswith(("torchherd ", "cat ")):
                continue
            stale = shown_lines(shown, home) - shown_lines(out, home)
            assert not stale, (step.command, "the page shows lines today's code does not print "
                               "(paste the real output in their place)", sorted(stale),
                               out[-3000:])
        # The prune removed what it said: on the controller all runs but the newest, on the
        # nodes the run directories of the good launch.
        said = "\n".join(out for _rc, out in results)
        launched = re.search(r"^run (\S+) succeeded:", said, flags=re.M).group(1)
        failed = re.search(r"^run (\S+) failed:", said, flags=re.M).group(1)
        kept = (home / "first-hour" / "runs").glob("[!.]*")  # not the interconnect's cache
        assert [p.name for p in kept] == [failed]
        for root in NODE_ROOTS:
            assert not (root / "runs" / launched).exists(), root
    finally:  # leave no run of this test on the shared local nodes
        if (home / "first-hour" / "runs").is_dir():
            subprocess.run([str(home / "torchherd-venv" / "bin" / "torchherd"), "runs",
                            "--prune", "--keep", "0", "-i", "inventories/local.ini", "--yes"],
                           cwd=home / "first-hour", env=env, capture_output=True, check=False,
                           timeout=300)
