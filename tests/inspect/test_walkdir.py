"""The walk beneath the root descriptor: a directory that opens but cannot be listed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import ckptgate.inspect.walkdir as walkdir
from ckptgate.inspect.walk import SafeTree

from ckpt_inspect_helpers import write


def test_a_directory_that_opens_but_cannot_be_listed_is_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """getdents can fail after the open succeeded (EACCES under /proc, EIO, ESTALE): the directory is
    refused as ``walk.dir_unreadable``, like one that cannot be opened, never an OSError (exit 1)."""
    write(tmp_path, "a.json", "{}")
    write(tmp_path, "sub/b.json", "{}")
    real = os.scandir

    def scandir(fd: int):  # type: ignore[no-untyped-def]
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/sub"):
            raise PermissionError(errno.EACCES, "Permission denied", fd)
        return real(fd)

    monkeypatch.setattr(walkdir.os, "scandir", scandir)
    with SafeTree.open(tmp_path) as t:
        assert [e.path for e in t.entries] == ["a.json"]
        assert [(f.path, f.code) for f in t.findings] == [("sub", "walk.dir_unreadable")]
        assert "Permission denied" in t.findings[0].message
