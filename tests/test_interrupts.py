"""``ckptgate.interrupts``: one typed abort for SIGHUP, SIGINT and SIGTERM before the commit point,
held inside a critical section, only noted after the commit; the previous handlers come back."""

from __future__ import annotations

import signal
import threading

import pytest

from ckptgate import interrupts
from ckptgate.errors import Aborted, ExitCode


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGHUP, ExitCode.HANGUP), (signal.SIGINT, ExitCode.INTERRUPTED),
                                           (signal.SIGTERM, ExitCode.TERMINATED)])
def test_each_signal_raises_one_typed_abort_with_its_exit_code(sig, code):
    before = signal.getsignal(sig)
    with interrupts.handling():
        with pytest.raises(interrupts.Interrupted) as ei:
            signal.raise_signal(sig)
        signal.raise_signal(sig)  # a second signal while the first unwinds is only noted
    assert signal.getsignal(sig) == before  # the previous handler is back
    err = ei.value.error()
    assert isinstance(err, Aborted) and err.exit_code == code == 128 + sig
    assert err.code == f"interrupted.{signal.Signals(sig).name.lower()}" and "nothing was published" in err.message


def test_a_signal_inside_a_critical_section_is_raised_when_it_ends():
    with interrupts.handling():
        done = []
        with pytest.raises(interrupts.Interrupted) as ei:
            with interrupts.critical():
                signal.raise_signal(signal.SIGTERM)
                done.append("the block ran to its end")
        assert done and ei.value.signum == signal.SIGTERM


def test_after_the_commit_a_signal_is_only_noted():
    with interrupts.handling():
        with interrupts.critical():
            signal.raise_signal(signal.SIGINT)  # held
            interrupts.committed()  # the rename succeeded inside the block
        signal.raise_signal(signal.SIGTERM)  # after it: noted
        assert interrupts.past_commit() and interrupts.received() == signal.SIGINT


def test_an_error_inside_the_critical_section_wins_over_a_held_signal():
    with interrupts.handling(), pytest.raises(OSError), interrupts.critical():
        signal.raise_signal(signal.SIGHUP)
        raise OSError("the rename failed: its own error says what happened")


def test_the_abort_cancels_the_registered_events():
    stop = threading.Event()
    with interrupts.handling(), pytest.raises(interrupts.Interrupted), interrupts.cancelling(stop):
        signal.raise_signal(signal.SIGTERM)
    assert stop.is_set()


def test_sigint_inherited_as_ignored_is_handled_and_sighup_ignored_stays_ignored():
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupts.handling():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # nohup
            with pytest.raises(interrupts.Interrupted):
                signal.raise_signal(signal.SIGINT)  # a background job of a shell: still stops
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGHUP, saved[1])


def test_without_handling_nothing_changes():
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    with interrupts.critical():
        interrupts.committed()
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before


def test_a_wait_for_a_future_ends_when_another_thread_takes_the_signal():
    """Session 44: the kernel may hand a signal to any thread; the main thread, waiting on a future
    in :func:`interrupts.result`, still raises the abort within its step, not when the work ends."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    with interrupts.handling(), ThreadPoolExecutor(max_workers=1) as pool:
        busy = pool.submit(release.wait, 20)
        worker = next(t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor"))
        start = time.monotonic()
        threading.Timer(0.1, signal.pthread_kill, (worker.ident, signal.SIGTERM)).start()
        try:
            with pytest.raises(interrupts.Interrupted):
                interrupts.result(busy)
        finally:
            release.set()
    assert time.monotonic() - start < 5


def test_a_wait_for_many_futures_ends_on_a_signal_or_the_first_failure():
    """The writer's wait for its outputs (:func:`interrupts.all_done`): a signal handed to a worker
    thread still aborts the main thread's wait within its step, and the first failure is raised
    while the other futures still run."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()

    def fail() -> None:
        raise OSError(28, "No space left on device")

    with interrupts.handling(), ThreadPoolExecutor(max_workers=2) as pool:
        try:
            busy = [pool.submit(release.wait, 20), pool.submit(fail)]
            start = time.monotonic()
            with pytest.raises(OSError, match="No space"):
                interrupts.all_done(busy)
            assert time.monotonic() - start < 5 and not busy[0].done()
            busy = [pool.submit(release.wait, 20)]
            worker = next(t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor"))
            threading.Timer(0.1, signal.pthread_kill, (worker.ident, signal.SIGTERM)).start()
            with pytest.raises(interrupts.Interrupted):
                interrupts.all_done(busy)
            assert time.monotonic() - start < 5
        finally:
            release.set()
