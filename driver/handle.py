"""A playbook running in a worker thread (RunHandle), and waiting for one in the calling
thread, where Ctrl-C cancels it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from driver.result import RunResult
from driver.runner import Event

OnInterrupt = Literal["stop", "detach"]
_END = object()


class RunHandle:
    """A playbook running in a background thread: its events, its end, its cancellation.

    ``events()`` yields ansible-runner events (dicts, as ansible-runner emits them, secret_env
    values masked) until the run ends, including those of the stop or status playbook that a
    cancel runs; ``wait()``
    returns the RunResult; ``cancel()`` stops the playbook and settles the job's fate. One
    consumer of ``events()`` at a time.
    """

    def __init__(self, run_id: str, run_dir: Path, inventory: str, action: str,
                 work: Callable[[RunHandle], RunResult],
                 on_interrupt: OnInterrupt = "stop") -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self.inventory = inventory
        self.action = action
        self.on_interrupt: OnInterrupt = on_interrupt
        self._work = work
        self._queue: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"torchherd-{run_id}",
                                        daemon=True)

    def start(self) -> RunHandle:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            self._result = self._work(self)
        except BaseException as exc:  # handed to the caller by wait()
            self._error = exc
        finally:
            self._done.set()
            self._queue.put(_END)

    def emit(self, event: Event) -> None:
        self._queue.put(event)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self, on_interrupt: OnInterrupt | None = None) -> None:
        """Stop the playbook; for a launch, then stop the job on every node, or, with
        on_interrupt 'detach', leave it running (a job that had not started on every node is
        stopped all the same: never half-way). Returns at once; wait() for the result."""
        if on_interrupt is not None:
            self.on_interrupt = on_interrupt
        self._cancel.set()

    def done(self) -> bool:
        return self._done.is_set()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events until the run ends; queue.Empty if none comes within ``timeout`` seconds."""
        while True:
            item = self._queue.get(timeout=timeout)
            if item is _END:
                self._queue.put(_END)  # for a later call, or another consumer
                return
            yield item

    def wait(self, timeout: float | None = None) -> RunResult:
        """The result, once the run (and any cleanup after a cancel) ended."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.run_id} still going after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def block(handle: RunHandle, on_event: Callable[[Event], None] | None) -> RunResult:
    """Wait for a handle in the calling thread; Ctrl-C there cancels it, then re-raises."""
    try:
        for event in handle.events():
            if on_event:
                on_event(event)
    except KeyboardInterrupt:
        handle.cancel()
        handle.wait()
        raise
    return handle.wait()
