# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
name: watch
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: The free strategy, asleep while every host waits on a long task
description:
  - Runs tasks like C(ansible.builtin.free) (each host at its own pace), but while tasks are in
    flight and no result has come back, the controller sleeps until a worker reports instead of
    looking every C(internal_poll_interval).
  - Made for watching jobs that run for hours or days with one long-blocking task per node;
    the idle controller wakes every few seconds instead of 50 to 1000 times a second.
  - A result is handled as soon as it arrives, so a failing node is seen no later than with
    C(ansible.builtin.free).
"""

import collections
import threading

from ansible.plugins.strategy.free import StrategyModule as FreeStrategy

# Longest sleep while waiting for results: bounds how late a cancelled run or a dead worker
# process (which sends no result) is noticed.
_IDLE_WAKE = 5.0


class _SignallingDeque(collections.deque):
    """The strategy's result queue, setting an event whenever a result is appended."""

    def __init__(self, event):
        super().__init__()
        self._event = event

    def append(self, x):
        super().append(x)
        self._event.set()


class StrategyModule(FreeStrategy):
    def __init__(self, tqm):
        super().__init__(tqm)
        self._arrived = threading.Event()
        with self._results_lock:
            pending = list(self._results)
            self._results = _SignallingDeque(self._arrived)
            self._results.extend(pending)

    def _process_pending_results(self, iterator, one_pass=False, max_passes=None):
        # Only the idle loops call this without limits; with tasks in flight and no result
        # queued, nothing can change until a worker reports.
        if not one_pass and max_passes is None and self._pending_results > 0 and not self._results:
            self._arrived.wait(_IDLE_WAKE)
        self._arrived.clear()
        return super()._process_pending_results(iterator, one_pass=one_pass, max_passes=max_passes)
