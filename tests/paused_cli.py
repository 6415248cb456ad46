"""``python tests/paused_cli.py STAGE MARK ARGS...``: the ``ckptgate`` command with ARGS, paused at one
stage of an intake until a signal arrives (at most 30 s), for tests/test_pipeline_signals.py.

At the pause it writes STAGE into the file MARK, so the test knows when to send its signal.  Nothing
else changes: every other step runs as in ``python -m ckptgate``.  The stages, in order:

``startup``        the CLI's launch, before the commands are imported and the arguments parsed
``hashing``        a digest thread, before its first chunk (it waits for the digest's cancel event)
``staging``        the staging directory beside DST has just been made
``consolidation``  the outputs are staged, before the index is written
``before_rename``  the receipt is written and fsynced, the last check before the rename
``in_rename``      the rename has published DST, inside its critical section
``after_rename``   publish() has returned
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STAGE, MARK = sys.argv[1], Path(sys.argv[2])
sys.argv[1:] = sys.argv[3:]

import ckptgate.digest  # noqa: E402
import ckptgate.grouped  # noqa: E402
import ckptgate.onepass  # noqa: E402
import ckptgate.outcome  # noqa: E402
import ckptgate.pipeline  # noqa: E402
import ckptgate.publish  # noqa: E402
from ckptgate import interrupts  # noqa: E402
from ckptgate._cli import _main  # noqa: E402

_paused = threading.Event()


def pause(stage: str, until: threading.Event | None = None) -> None:
    if stage != STAGE or _paused.is_set():
        return
    _paused.set()
    MARK.write_text(stage)
    if until is not None:  # a digest thread: the signal handler sets the digest's cancel event
        until.wait(30)
        return
    deadline = time.monotonic() + 30
    while interrupts.received() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # the handler raises here, unless the signal is held or comes after the commit


def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    setattr(owner, name, make(getattr(owner, name)))


patch(_main, "_commands_then_cli", lambda f: lambda: (pause("startup"), f())[1])
patch(ckptgate.digest, "_hash_fd", lambda f: lambda *a: (pause("hashing", a[-1]), f(*a))[1])


def _staging(f: Any) -> Any:
    @contextlib.contextmanager
    def staging(dest: Any) -> Iterator[Any]:
        with f(dest) as stage:
            pause("staging")
            yield stage

    return staging


for composer in (ckptgate.grouped, ckptgate.onepass):
    patch(composer, "staging", _staging)
    patch(composer, "write_index", lambda f: lambda *a, **k: (pause("consolidation"), f(*a, **k))[1])


def _is_within(f: Any) -> Any:
    def is_within(*a: Any) -> Any:
        if sys._getframe(1).f_code.co_name == "publish":
            pause("before_rename")
        return f(*a)

    return is_within


def _renameat2(f: Any) -> Any:
    def renameat2(*a: Any) -> Any:
        done = f(*a)
        if not str(a[1]).startswith(".ckptgate-probe"):
            pause("in_rename")
        return done

    return renameat2


patch(ckptgate.publish, "is_within", _is_within)
patch(ckptgate.publish, "renameat2", _renameat2)
patch(ckptgate.outcome, "publish", lambda f: lambda *a, **k: (f(*a, **k), pause("after_rename"))[0])

_main.main()
