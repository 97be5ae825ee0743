# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The linear strategy, woken by the workers' results instead of polling for them."""

from __future__ import annotations

DOCUMENTATION = r"""
name: linear
author: torchherd developers
version_added: 0.2.0
short_description: ansible.builtin.linear that sleeps until a result arrives
description:
  - Runs the play exactly as C(ansible.builtin.linear) does (task by task, every host, the same
    failure, C(run_once) and C(any_errors_fatal) handling); only the waits differ.
  - While tasks are in flight, the built-in strategy looks for results every
    C(internal_poll_interval) (0.001 s by default, 0.02 s in torchherd's driver), however long
    the tasks run, so a task of hours (the watch's wait on the job) costs the controller CPU
    all along. Here the wait for results sleeps until a worker's result arrives, and looks at
    least once a second for dead workers and an interrupted run.
  - With more hosts than forks, the built-in strategy looks for a free worker every 0.1 ms
    while all are busy, a spinning core for as long as the longest task of a batch runs. Here
    it looks every 5 ms.
  - The launch's playbooks use it on every play that runs on the nodes.
notes:
  - Tested with ansible-core 2.19, the version range the collection claims.
"""

import threading
import time
from collections import deque

from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule

# How long a wait for results sleeps at most before it looks for dead workers and an interrupt.
LONGEST_SLEEP = 1.0
# How often the queueing looks for a free worker while every one is busy.
WORKER_POLL = 0.005


class _Arrivals(deque):
    """The strategy's result queue, which wakes the waiting strategy on every result."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__()
        self.arrived = event

    def append(self, x) -> None:
        super().append(x)
        self.arrived.set()


def _busy(worker) -> bool:
    try:
        return worker is not None and worker.is_alive()
    except ValueError:  # closed: its slot is free
        return False


class StrategyModule(LinearStrategyModule):
    def __init__(self, tqm) -> None:
        super().__init__(tqm)
        self._arrived = threading.Event()
        self._waiting = False
        # Nothing is queued yet, so no result can be in the base's queue: swap it for one that
        # signals. Should a later ansible-core hold its results elsewhere, this strategy
        # polls exactly as the built-in one does.
        if isinstance(self._results, deque) and not self._results:
            with self._results_lock:
                self._results = _Arrivals(self._arrived)

    def _wait_on_pending_results(self, iterator):
        self._waiting = isinstance(self._results, _Arrivals)
        try:
            return super()._wait_on_pending_results(iterator)
        finally:
            self._waiting = False

    def _process_pending_results(self, iterator, one_pass=False, max_passes=None):
        # Only the wait for the round's last results sleeps here; queueing does not.
        if self._waiting and self._pending_results > 0 and not self._results:
            self._arrived.wait(LONGEST_SLEEP)
        # Cleared before the results are taken: one that arrives later sets it again.
        self._arrived.clear()
        return super()._process_pending_results(iterator, one_pass=one_pass, max_passes=max_passes)

    def _queue_task(self, host, task, task_vars, play_context):
        while self._workers and all(_busy(w) for w in self._workers):
            time.sleep(WORKER_POLL)
        return super()._queue_task(host, task, task_vars, play_context)
