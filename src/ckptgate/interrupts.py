"""SIGINT, SIGTERM and SIGHUP: one typed abort before a run's commit point, nothing after it.

The CLI installs the handlers once, at launch (:func:`handling`), for the three signals.  Until the
run's commit point, a signal raises :class:`Interrupted` in the main thread (a ``BaseException``, so
that no ``except Exception`` on the way swallows it) and sets every event registered with
:func:`cancelling` (the digest's threads stop at their next chunk).  Everything the run opened is
closed as the exception unwinds: the staging directory is removed, the contained worker's process
group and the embedded OPA are killed and reaped.  The CLI reports it as :class:`ckptgate.errors.Aborted`:
exit ``128 + signal`` (129, 130, 143), "nothing was published".

:func:`critical` holds signals over a block that must not be cut in two (the rename that publishes,
the removal of a staging directory): one that arrives inside is raised when the block ends.
:func:`committed`, called inside the publishing rename's block once the rename succeeded, marks the
commit point: from then on a signal is only noted (:func:`received`), so a publication that is
complete is reported as published (exit 0 and the normal output), never as interrupted.

After the first abort is raised, later signals are only noted too: they cannot cut the clean-up
short.  Without :func:`handling` (a library caller) nothing here changes how signals are handled,
and :func:`critical` and :func:`committed` cost a flag.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any, TypeVar

from ckptgate.errors import Aborted

__all__ = [
    "SIGNALS",
    "Interrupted",
    "all_done",
    "cancelling",
    "committed",
    "critical",
    "handling",
    "past_commit",
    "received",
    "result",
]

#: The signals that abort a run: a hang-up, an interrupt (Ctrl-C), a polite termination.
SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """One of :data:`SIGNALS` arrived before the commit point; :meth:`error` is its typed report."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def error(self) -> Aborted:
        return Aborted(self.signum)


class _State:
    """The one process-wide state the handler reads and writes (main thread only)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.installed = False
        self.held = 0  # depth of nested critical() blocks
        self.pending: int | None = None  # a signal held by critical(), raised when the block ends
        self.committed = False
        self.raised = False  # the abort is unwinding: later signals must not cut the clean-up short
        self.received: int | None = None  # the first signal that arrived, whatever became of it
        self.cancels: set[threading.Event] = set()


_state = _State()


def _handler(signum: int, _frame: object) -> None:
    if _state.received is None:
        _state.received = signum
    if _state.committed or _state.raised:
        return  # published (reported as such), or already unwinding
    if _state.held:
        if _state.pending is None:
            _state.pending = signum
        return
    _abort(signum)


def _abort(signum: int) -> None:
    _state.raised = True
    for event in list(_state.cancels):  # one C call under the GIL: no lock the main thread could hold
        event.set()
    raise Interrupted(signum)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Install the handlers of :data:`SIGNALS` for the block (the CLI's whole run) and restore the
    previous ones after it.

    A signal that was ignored when the process started is handled all the same, but for SIGHUP:
    ``nohup`` (or a caller that ignores it on purpose) keeps the run alive when its terminal goes
    away.  A shell starts a background job with SIGINT ignored, and ``kill -INT`` must still stop
    it.  Only the main thread can install handlers; elsewhere, and nested in another such block,
    this does nothing.
    """
    if _state.installed or threading.current_thread() is not threading.main_thread():
        yield  # nested in an outer block, which keeps the handlers and the state
        return
    previous: dict[signal.Signals, Any] = {}
    _state.reset()
    try:
        for sig in SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            previous[sig] = signal.signal(sig, _handler)
        _state.installed = True
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _state.reset()


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold :data:`SIGNALS` for the block; a held signal is raised when the outermost block ends,
    unless the block raised (its own error says what happened) or :func:`committed` was called in it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals run their handler in the main thread only: nothing here can be cut short by one
        return
    _state.held += 1
    try:
        yield
    finally:
        _state.held -= 1
    if _state.held == 0 and _state.pending is not None and not _state.committed and not _state.raised:
        signum, _state.pending = _state.pending, None
        _abort(signum)


def committed() -> None:
    """The commit point has passed (DST is published): from now on a signal is only noted."""
    _state.committed = True
    _state.pending = None


def past_commit() -> bool:
    """Whether :func:`committed` was called in this run: a signal now finds the publication complete."""
    return _state.committed


def received() -> int | None:
    """The first of :data:`SIGNALS` that arrived while :func:`handling` was installed, else ``None``."""
    return _state.received


@contextlib.contextmanager
def cancelling(event: threading.Event) -> Iterator[threading.Event]:
    """Set ``event`` when a signal aborts the run while the block runs (threads that watch it stop)."""
    _state.cancels.add(event)
    try:
        yield event
    finally:
        _state.cancels.discard(event)


T = TypeVar("T")


def result(future: Future[T]) -> T:
    """``future.result()``, waited for in short steps.  The kernel may hand a signal to any thread,
    and Python runs its handler (which raises :class:`Interrupted` and cancels the digest) only
    when the main thread runs again: a wait with no end could hold an abort until the work is done."""
    while True:
        try:
            return future.result(timeout=0.05)
        except TimeoutError:
            continue


def all_done(futures: Iterable[Future[Any]]) -> None:
    """Wait for every future in short steps (as :func:`result` does), raising the first failure as
    soon as it happens, not after the others end."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=0.05, return_when=FIRST_EXCEPTION)
        for f in done:
            f.result()
