"""Files a user names: read bounded and regular only; written whole, never into an input."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ckptgate import userfiles
from ckptgate.errors import UsageError
from ckptgate.userfiles import read_regular_file, write_output_file


def test_read_returns_at_most_one_byte_more_than_the_limit(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert read_regular_file(p, limit=200) == b"x" * 100
    assert read_regular_file(p, limit=10) == b"x" * 11


@pytest.mark.parametrize("make", ["fifo", "dir", "dev_zero"])
def test_read_refuses_what_is_not_a_regular_file_before_reading(tmp_path: Path, make: str) -> None:
    if make == "fifo":
        p = tmp_path / "fifo"
        os.mkfifo(p)  # opening it for a blocking read would wait for a writer forever
    elif make == "dir":
        p = tmp_path
    else:
        p = Path("/dev/zero")  # endless
    with pytest.raises(OSError) as e:
        read_regular_file(p, limit=1 << 20)
    assert e.value.errno in (errno.EINVAL, errno.EISDIR)


def test_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "report.html"
    p.write_text("old")
    write_output_file(p, b"new", what="the report")
    assert p.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["report.html"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "report.sarif"
    p.write_text("old")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(userfiles.os, "fsync", no_space)
    with pytest.raises(UsageError) as e:
        write_output_file(p, b"new", what="the SARIF report")
    assert e.value.code == "usage.output_unwritable" and "No space left" in e.value.message
    assert p.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["report.sarif"]


def test_exclusive_refuses_an_existing_file(tmp_path: Path) -> None:
    p = tmp_path / "key.pem"
    p.write_text("mine")
    with pytest.raises(UsageError) as e:
        write_output_file(p, b"other", what="the private key", exclusive=True)
    assert e.value.code == "usage.exists" and p.read_text() == "mine"


def test_a_target_inside_an_input_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    for target in (ckpt / "model.safetensors", ckpt / "new.html", tmp_path / "link" / "x.html"):
        if target.parent.name == "link":
            (tmp_path / "link").symlink_to(ckpt)
        with pytest.raises(UsageError) as e:
            write_output_file(target, b"<html>", what="the HTML report", not_inside=[ckpt])
        assert e.value.code == "usage.output_inside_input"
    assert sorted(os.listdir(ckpt)) == ["model.safetensors"] and (ckpt / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize(("target", "code"), [("missing/r.html", "usage.output_parent"),
                                              ("afile/r.html", "usage.output_parent"),
                                              ("adir", "usage.exists"),
                                              ("", "usage.output_path"),
                                              ("a" * 300 + "/r.html", "usage.output_parent")])
def test_bad_targets_are_typed_usage_errors(tmp_path: Path, target: str, code: str) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    with pytest.raises(UsageError) as e:
        write_output_file(tmp_path / target if target else Path(""), b"x", what="the report")
    assert e.value.code == code


def test_new_files_get_the_mode_less_the_umask_and_long_names_fit(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_output_file(tmp_path / "report.html", b"x", what="the report")
        write_output_file(tmp_path / "key.pem", b"k", what="the private key", mode=0o600, exclusive=True)
    finally:
        os.umask(old)
    assert (tmp_path / "report.html").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "key.pem").stat().st_mode & 0o777 == 0o600
    long = tmp_path / ("r" * 250 + ".html")
    write_output_file(long, b"x", what="the report")
    assert long.read_bytes() == b"x" and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["report.html", "key.pem", long.name])


def test_a_parent_swapped_for_a_symlink_into_the_input_after_the_check_is_refused(tmp_path, monkeypatch):
    """The F7 class for reports: after the check by path, the report's directory becomes a symlink
    into the checkpoint; the write goes through a descriptor proved to lie outside it."""
    import ckptgate.userfiles as uf

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"x")
    reports = tmp_path / "reports"
    reports.mkdir()
    real = uf.check_output_file

    def check_then_swap(*args, **kwargs):
        found = real(*args, **kwargs)
        reports.rename(tmp_path / "reports.orig")
        reports.symlink_to(checkpoint, target_is_directory=True)
        return found

    monkeypatch.setattr(uf, "check_output_file", check_then_swap)
    with pytest.raises(UsageError) as e:
        uf.write_output_file(reports / "report.html", b"<html/>", what="the HTML report", not_inside=[checkpoint])
    assert e.value.code == "usage.output_inside_input"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["model.safetensors"]


def test_outputs_are_written_whole_through_the_parent_descriptor(tmp_path):
    from ckptgate.userfiles import write_output_file

    write_output_file(tmp_path / "k.pem", b"secret", what="the key", mode=0o600, exclusive=True)
    assert (tmp_path / "k.pem").read_bytes() == b"secret"
    assert oct((tmp_path / "k.pem").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(UsageError) as e:
        write_output_file(tmp_path / "k.pem", b"other", what="the key", exclusive=True)
    assert e.value.code == "usage.exists"
    write_output_file(tmp_path / "r.json", b"1", what="the report")
    write_output_file(tmp_path / "r.json", b"2", what="the report")
    assert (tmp_path / "r.json").read_bytes() == b"2"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
