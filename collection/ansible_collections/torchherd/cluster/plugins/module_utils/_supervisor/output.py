# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""When the job first said something on this node, and when each of torchrun's attempts
started and first said something (the run-state record's job section)."""

from __future__ import annotations

import os
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _attempts(rank_logs):
    """{attempt number: whether a rank wrote output in it} of the attempt_<n> directories
    (torchrun starts the workers anew in each, and makes the directory as it does)."""
    found = {}
    for top, _dirs, names in os.walk(rank_logs):
        parts = os.path.relpath(top, rank_logs).split(os.sep)
        attempt = next((p for p in parts if p.startswith("attempt_")), None)
        if attempt and attempt[8:].isdigit():
            number = int(attempt[8:])
            found[number] = found.get(number, False) or any(
                name.endswith(".log") and _size(os.path.join(top, name)) > 0 for name in names)
    return found


def first_output(proc, paths, rank_logs, log_before, interval=0.1, attempts=False,
                 attempt_interval=1.0):
    """Records in the run-state record when the job first said something on this node (its
    time to first output): the first byte in a rank's own log file where the launcher writes
    them (rank_logs: torchrun, accelerate), else the node log's growth past `log_before`, its
    size at the start (DeepSpeed's launcher writes no per-rank files, so its own first line
    counts). Polls until then or until the launcher ends: a stat of a few small files, ten
    times a second.

    `attempts` (torchrun restarts its workers itself): it then looks until the launcher ends,
    once a second after the first output, and records when each attempt started here and when
    its ranks first said something (job.attempts: attempt number to started_at, output_at),
    which dates the restarted job's first output."""
    said_at = None
    seen = {}
    tracked = attempts and rank_logs is not None
    while True:
        # Whether it had ended before the look: output written before its end is seen.
        ended = proc.poll() is not None
        # The attempts first: output one of them shows, the look for the first output below
        # sees too (files only grow), so both get the same time.
        found = _attempts(rank_logs) if tracked else {}
        said = said_at is None and (
            _size(paths["log"]) > log_before if rank_logs is None else
            any(_size(os.path.join(top, name)) > 0
                for top, _dirs, names in os.walk(rank_logs) for name in names
                if name.endswith(".log")))
        # Taken after the looks: what they saw happened by then.
        now = time.time()
        if said:
            said_at = now
            record(paths, "job", first_output_at=now)
        if tracked:
            changed = False
            for number, spoke in found.items():
                if str(number) not in seen:
                    seen[str(number)] = {"started_at": now, "output_at": None}
                    changed = True
                entry = seen[str(number)]
                if spoke and entry["output_at"] is None:
                    entry["output_at"], changed = now, True
            if changed:
                record(paths, "job", attempts={k: dict(v) for k, v in seen.items()})
        elif said_at is not None:
            return
        if ended:
            return
        time.sleep(interval if said_at is None else attempt_interval)
