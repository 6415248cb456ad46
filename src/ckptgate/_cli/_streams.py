"""Output streams that a closed reader cannot turn into a failure (``ckptgate intake ... | head -1``).

While a command runs, ``sys.stdout`` and ``sys.stderr`` are wrapped (:func:`guarded`): the first
write or flush that meets a closed pipe (``BrokenPipeError``) puts ``/dev/null`` on the stream's
descriptor (``dup2``), so nothing more reaches the closed stream, no later write raises, and
neither does Python's flush at exit; the write is dropped.  The command goes on and exits with its
outcome's code (0 when published): a reader that stops reading is not a failure of the gate.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["guarded"]


class _Guarded:
    """A text stream that drops what it cannot write to a closed pipe; everything else is the
    wrapped stream's (``isatty``, ``fileno``, ``encoding``...)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def _closed(self) -> None:
        """Point the descriptor at ``/dev/null``: what is still buffered, and Python's flush at exit,
        go there instead of raising again."""
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor (a test's buffer)
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.closed_by_reader:
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()  # into /dev/null now: empties the buffer
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` guarded against a closed reader for the block."""
    if isinstance(sys.stdout, _Guarded) or sys.stdout is None or sys.stderr is None:
        yield  # nested in an outer block (or no streams at all)
        return
    saved = sys.stdout, sys.stderr
    out, err = _Guarded(saved[0]), _Guarded(saved[1])
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved
