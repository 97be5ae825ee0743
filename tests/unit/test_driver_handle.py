"""RunHandle: events until the end, wait(), cancel(), and Ctrl-C in a blocking call."""

import threading
from pathlib import Path

import pytest

from driver.handle import RunHandle, block
from driver.result import Exit, RunResult


def fake_work(stop_after: int | None = None):
    """Emits numbered events until cancelled (or after stop_after of them)."""
    def work(handle: RunHandle) -> RunResult:
        n = 0
        while not handle.cancelled and (stop_after is None or n < stop_after):
            handle.emit({"event": "tick", "n": n})
            n += 1
            threading.Event().wait(0.01)
        code = Exit.CANCELLED if handle.cancelled else Exit.OK
        return RunResult("r", Path("/nonexistent"), "launch", handle.on_interrupt, code, "")
    return work


def test_events_end_with_the_run_and_wait_returns_the_result():
    handle = RunHandle("r", Path("/x"), Path("/inv"), "launch", fake_work(5)).start()
    assert [e["n"] for e in handle.events(timeout=5)] == [0, 1, 2, 3, 4]
    assert list(handle.events(timeout=5)) == []  # a second call ends at once too
    assert handle.done() and handle.wait().exit_code == Exit.OK


def test_cancel_with_a_choice_of_fate():
    handle = RunHandle("r", Path("/x"), Path("/inv"), "launch", fake_work()).start()
    next(handle.events(timeout=5))
    handle.cancel(on_interrupt="detach")
    result = handle.wait(timeout=5)
    assert (result.exit_code, result.state) == (Exit.CANCELLED, "detach")


def test_wait_times_out_and_errors_reach_the_caller():
    handle = RunHandle("r", Path("/x"), Path("/inv"), "launch", fake_work()).start()
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.05)
    handle.cancel()
    handle.wait(timeout=5)

    def broken(_handle):
        raise RuntimeError("no ansible-playbook")
    with pytest.raises(RuntimeError, match="no ansible-playbook"):
        RunHandle("r", Path("/x"), Path("/inv"), "launch", broken).start().wait(timeout=5)


def test_ctrl_c_in_a_blocking_call_cancels_settles_and_reraises():
    handle = RunHandle("r", Path("/x"), Path("/inv"), "launch", fake_work()).start()

    def on_event(event):
        if event["n"] == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        block(handle, on_event)
    # By the time the KeyboardInterrupt arrives, the run has settled.
    assert handle.done() and handle.wait().exit_code == Exit.CANCELLED
