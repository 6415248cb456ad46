"""One rank of ``ckptgate intake --distributed`` for tests/test_distributed.py, run by torchrun.

It runs the real CLI, and records this rank's exit status in ``$CKPTGATE_TEST_RCDIR/rank<R>.rc``
(torchrun reports only its own).  Test hooks, both set through the environment:
``CKPTGATE_TEST_SECRET_RANK<R>`` replaces rank R's secret (a wrong HMAC key), and
``CKPTGATE_TEST_KILL_RANK=R`` makes rank R SIGKILL itself after writing part of its first output,
``CKPTGATE_TEST_STALL_RANK=R`` makes rank R stop answering once it has created its outputs, and
``CKPTGATE_TEST_WRITER_RANK=R`` makes another process open ``$CKPTGATE_TEST_WRITER_PATH`` for
writing just before rank R writes each output, and ``CKPTGATE_TEST_FLIP_RANK=R`` makes rank R
flip the byte at ``$CKPTGATE_TEST_FLIP_OFFSET`` of ``$CKPTGATE_TEST_FLIP_PATH`` in the stage phase.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

rank = os.environ.get("RANK", "0")
secret = os.environ.get(f"CKPTGATE_TEST_SECRET_RANK{rank}")
if secret is not None:
    if secret:
        os.environ["CKPTGATE_DIST_SECRET"] = secret
    else:
        os.environ.pop("CKPTGATE_DIST_SECRET", None)
if os.environ.get("CKPTGATE_TEST_KILL_RANK") == rank:
    import ckptgate.consolidate.writer as d

    def _die(name: str, fd: int, *args: object, **kwargs: object) -> object:
        os.write(fd, b"partial")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    d.copy_in_order = _die  # the test's kill point, mid-write

if os.environ.get("CKPTGATE_TEST_STALL_RANK") == rank:
    import time

    import ckptgate.consolidate.writer as d

    _lay_out = d.lay_out

    def _stall(*args: object, **kwargs: object) -> object:
        _lay_out(*args, **kwargs)  # the outputs created, then it stops answering without dying
        time.sleep(3600)  # (on the main thread, where the launcher's SIGTERM ends it)
        raise AssertionError("unreachable")

    d.lay_out = _stall

if os.environ.get("CKPTGATE_TEST_WRITER_RANK") == rank:
    import subprocess

    import ckptgate.consolidate.writer as d

    _write = d.copy_in_order

    def _opened_for_writing(*args: object, **kwargs: object) -> object:
        # another process opens a source for writing mid-copy; O_NONBLOCK: it fails at once, and the
        # kernel still breaks every read lease on the file
        code = ("import os\ntry:\n    os.open(os.environ['P'], os.O_WRONLY | os.O_NONBLOCK)\n"
                "except BlockingIOError:\n    pass\n")
        subprocess.run([sys.executable, "-c", code], check=True,
                       env={**os.environ, "P": os.environ["CKPTGATE_TEST_WRITER_PATH"]})
        return _write(*args, **kwargs)

    d.copy_in_order = _opened_for_writing

if os.environ.get("CKPTGATE_TEST_FLIP_RANK") == rank:
    import ckptgate.consolidate.shares as d

    _plan_sha256 = d.plan_sha256

    def _flip_then_hash(plan: object) -> str:
        # in the stage phase: after every rank hashed, before any rank copies (they wait for this one)
        with open(os.environ["CKPTGATE_TEST_FLIP_PATH"], "r+b") as f:
            f.seek(int(os.environ["CKPTGATE_TEST_FLIP_OFFSET"]))
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
        return _plan_sha256(plan)  # type: ignore[arg-type]

    d.plan_sha256 = _flip_then_hash

rc: object = 1


def _record(code: object) -> None:
    out = os.environ.get("CKPTGATE_TEST_RCDIR")
    if out:
        Path(out, f"rank{rank}.rc").write_text(str(code))


import ckptgate._cli.intake_cmd as intake_cmd  # noqa: E402 - after the hooks above

_exit_now = intake_cmd.exit_now


def _recorded_exit(code: int) -> None:  # a rank that ran ends without the interpreter's teardown
    _record(code)
    _exit_now(code)


intake_cmd.exit_now = _recorded_exit
try:
    from ckptgate._cli import main

    sys.argv = ["ckptgate", *sys.argv[1:]]
    main()
except SystemExit as e:
    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    raise
finally:
    _record(rc)
