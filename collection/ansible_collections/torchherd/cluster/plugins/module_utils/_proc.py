# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the kernel says of a process in /proc/<pid>/stat, /proc/<pid>/environ and
/proc/<pid>/status (see proc(5))."""

from __future__ import annotations

import os
import pwd


def read_stat(pid):
    """The fields of process `pid` that its callers use: state (R, S, Z...), ppid, pgrp,
    session, start_time (clock ticks since boot, as written: it tells a live pid from a reused
    one) and exit_status (the wait status of an ended process, not yet reaped; None before
    Linux 3.5). None where there is no such process (any more)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name in parentheses may hold spaces and parentheses itself: the fields are
    # what follows the last ")".
    _comm, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    return {"state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2]),
            "session": int(fields[3]), "start_time": fields[19],
            "exit_status": int(fields[49]) if len(fields) > 49 else None}


def proc_start_time(pid):
    """Start time of a process (read_stat's start_time), or None where it is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat["start_time"]


def environs(skip=None):
    """(pid, environment as a list of b"NAME=value") of every process this user may read, all
    but ``skip``; a process that ended while it was read is passed over."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == skip:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                yield int(entry), handle.read().split(b"\0")
        except OSError:
            continue


def process_user(pid):
    """The name of the user process `pid` runs as (its real uid, /proc/<pid>/status; the uid
    itself where no name is known), or None where there is no such process to read (gone, or
    in another pid namespace)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            uid = next((line.split()[1] for line in handle if line.startswith("Uid:")), None)
    except (OSError, IndexError):
        return None
    if uid is None:
        return None
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError):
        return uid
