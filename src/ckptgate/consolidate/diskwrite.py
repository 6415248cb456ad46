"""How the writers put bytes on the disk: whole writes, and write-back started without waiting.

One module, so that every writer (:mod:`~ckptgate.consolidate.writer`, its held mode
:mod:`~ckptgate.consolidate.held`, and :mod:`~ckptgate.consolidate.streamed`) writes through the
same calls.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["pwrite_all", "start_write_back", "write_back"]

_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def start_write_back(fd: int, offset: int, length: int) -> None:
    """Start (never wait for) the write-back of bytes ``[offset, offset + length)`` already written
    to ``fd``: one call for the many small writes of a window (the runs of strided placements)."""
    if length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def write_back(fd: int, data: memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` and start (never wait for) its write-back to the disk.

    The hint's result is ignored: where the file system refuses it, fsync simply does it all.
    """
    pwrite_all(fd, data, offset)
    _sync_file_range(fd, offset, len(data), _SYNC_FILE_RANGE_WRITE)
