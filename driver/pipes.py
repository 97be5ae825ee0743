"""Named pipes where ansible-runner and ansible-playbook expect files, so that what passes
through them is on no disk, not even for the length of a run.

Two things would otherwise sit in the private data directory while a run lasts (and after it,
where the driver is killed outright): the extra vars (the job, with the values of its
secret_env), which ansible-playbook reads once with ``-e @path``, and the ``command`` file that
ansible-runner writes into its artifacts: the command line and the whole environment of the
driver (every token exported in the caller's shell). A pipe passes the first from this process
to ansible-playbook, and takes the second from ansible-runner to nowhere. Either end that never
comes (ansible-playbook failed before it read its extra vars, say) is stood in for at the close,
so that no thread is left waiting.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _make(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.mkfifo(path, 0o600)


def _release(thread: threading.Thread, path: Path, flags: int) -> None:
    """Until ``thread`` ends (5 s at most): open the pipe's other end without waiting and close
    it at once, so that the thread, blocked in its own open() of the pipe, goes on and sees an
    empty or closed pipe. Then the pipe goes."""
    for _ in range(50):
        if not thread.is_alive():
            break
        try:
            os.close(os.open(path, flags | os.O_NONBLOCK))
        except OSError as exc:  # ENXIO: no reader waits yet (or any more)
            if exc.errno != errno.ENXIO:
                raise
        thread.join(0.1)
    path.unlink(missing_ok=True)


@contextlib.contextmanager
def _pipe(path: Path, end: Callable[[], None], other_end: int) -> Iterator[Path]:
    """A pipe at ``path`` (0600) whose one end ``end`` takes in a thread of this process; at
    the close the other end (``other_end``, the open flags) is stood in for where none came."""
    _make(path)
    thread = threading.Thread(target=end, name=f"pipe {path.name}", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        _release(thread, path, other_end)


@contextlib.contextmanager
def handed_over(path: Path, data: Any) -> Iterator[Path]:
    """A pipe at ``path`` (0600) that gives ``data`` as JSON to the first process that reads
    it, written from a thread of this one; removed at the end."""
    payload = json.dumps(data).encode()

    def write() -> None:
        try:
            with open(path, "wb") as pipe:  # waits for the reader
                pipe.write(payload)
        except (BrokenPipeError, FileNotFoundError):
            pass  # the reader left early, or the pipe is gone: nothing was read

    with _pipe(path, write, os.O_RDONLY):
        yield path


@contextlib.contextmanager
def drained(path: Path) -> Iterator[Path]:
    """A pipe at ``path`` (0600) where a file would be written: what a writer puts in it is read
    and dropped. Removed at the end."""

    def drain() -> None:
        with open(path, "rb") as pipe:  # waits for the writer
            while pipe.read(1 << 16):
                pass

    with _pipe(path, drain, os.O_WRONLY):
        yield path
