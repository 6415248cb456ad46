"""Atomic publication: DST is absent or complete; never replaced; stale staging cleaned; every
operation relative to DST's parent resolved once, never inside the source."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ckptgate._fs import file_id, is_within
from ckptgate.errors import RuntimeFailure, UsageError
from ckptgate.publish import (
    RECEIPT_NAME,
    check_destination,
    open_destination,
    publish,
    remove_stale_staging,
    staging,
)


def _put(stage, name: str, data: bytes) -> None:
    """Write a file into the staging directory by its descriptor, as the writer does."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=stage.fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _dir_id(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_publish_renames_staging_into_place(tmp_path):
    dst = tmp_path / "out"
    with open_destination(dst) as dest, staging(dest) as stage:
        _put(stage, "model.safetensors", b"x")
        assert publish(stage, {"decision_id": "d"}) == dst
    assert (dst / "model.safetensors").read_bytes() == b"x"
    assert json.loads((dst / RECEIPT_NAME).read_text())["decision_id"] == "d"
    assert sorted(os.listdir(dst)) == [RECEIPT_NAME, "model.safetensors"]  # nothing of the file-system probe
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_existing_dst_is_refused_before_any_work(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("precious")
    with pytest.raises(UsageError) as e:
        with open_destination(dst):
            pass
    assert e.value.code == "usage.dst_exists"
    assert (dst / "keep").read_text() == "precious"


def test_dst_appearing_during_the_run_is_not_replaced(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(UsageError) as e:
        with open_destination(dst) as dest, staging(dest) as stage:
            dst.mkdir()
            (dst / "keep").write_text("precious")
            publish(stage, {})
    assert e.value.code == "usage.dst_exists"
    assert (dst / "keep").read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_failure_leaves_no_dst_and_no_staging(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with open_destination(dst) as dest, staging(dest) as stage:
            _put(stage, "half", b"partial")
            raise RuntimeError("boom")
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_kill_9_before_rename_leaves_dst_absent_and_is_cleaned_next_time(tmp_path):
    dst = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from ckptgate.publish import open_destination, staging
        with open_destination(Path({str(dst)!r})) as dest, staging(dest) as stage:
            os.close(os.open("half.safetensors", os.O_WRONLY | os.O_CREAT, dir_fd=stage.fd))
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    assert proc.wait() == -9
    assert not dst.exists()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".out.ckptgate-staging-")
    with open_destination(dst) as dest, staging(dest) as stage:
        _put(stage, "m", b"ok")
        publish(stage, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_live_staging_directory_of_another_intake_is_left_alone(tmp_path):
    """Two intakes into the same parent: the second never removes the first's staging directory."""
    with open_destination(tmp_path / "first") as d1, staging(d1) as first:
        _put(first, "part", b"in progress")
        with open_destination(tmp_path / "second") as d2, staging(d2) as second:
            assert (first.path / "part").read_bytes() == b"in progress"
            publish(second, {})
        publish(first, {})
    assert (tmp_path / "first" / "part").read_bytes() == b"in progress"


def test_a_staging_directory_not_yet_locked_by_its_intake_is_not_taken_for_stale(tmp_path):
    """Between mkdtemp and flock an intake holds its parent's lock shared: no clean-up runs then."""
    fresh = tmp_path / ".out.ckptgate-staging-abc123"
    fresh.mkdir()  # created, not yet locked
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(parent, fcntl.LOCK_SH)  # what staging() holds while it creates and locks
        assert remove_stale_staging(parent) == [] and fresh.exists()
        fcntl.flock(parent, fcntl.LOCK_UN)
        assert remove_stale_staging(parent) == [fresh.name] and not fresh.exists()  # an owner that is gone
    finally:
        os.close(parent)


# -- DST's parent resolved once (issue #16, F7) ----------------------------------------------------
def _swap_for_symlink(parent, target):
    """The attack: move ``parent`` aside and put a symlink to ``target`` in its place."""
    moved = parent.with_name(parent.name + ".orig")
    parent.rename(moved)
    parent.symlink_to(target, target_is_directory=True)
    return moved


def _tree(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_swapping_the_parent_for_a_symlink_after_it_was_opened_publishes_at_the_original_parent(tmp_path):
    src, parent = tmp_path / "src", tmp_path / "parent"
    src.mkdir()
    (src / "weights.safetensors").write_bytes(b"measured")
    parent.mkdir()
    before = _tree(src)
    with open_destination(parent / "out", source_root=_dir_id(src)) as dest:
        moved = _swap_for_symlink(parent, src)
        with staging(dest) as stage:
            _put(stage, "model.safetensors", b"x")
            publish(stage, {})
    assert _tree(src) == before  # nothing was written inside the source
    assert (moved / "out" / "model.safetensors").read_bytes() == b"x"
    assert (moved / "out" / RECEIPT_NAME).exists()


@pytest.mark.parametrize("moment", ["before_staging", "before_publish"])
def test_a_parent_moved_into_the_source_is_refused_on_the_descriptors(tmp_path, moment):
    """The directory we hold is itself moved beneath the source: the staging directory and the
    rename are checked against the source root by descriptor, and nothing is published there."""
    src, parent = tmp_path / "src", tmp_path / "parent"
    src.mkdir()
    parent.mkdir()
    with pytest.raises(UsageError) as e:
        with open_destination(parent / "out", source_root=_dir_id(src)) as dest:
            if moment == "before_staging":
                parent.rename(src / "moved")
            with staging(dest) as stage:
                _put(stage, "model.safetensors", b"x")
                if moment == "before_publish":
                    parent.rename(src / "moved")
                publish(stage, {})
    assert e.value.code == "usage.dst_inside_source"
    assert _tree(src) == ["moved"]  # no DST and no staging directory left in it


def test_a_parent_that_resolves_into_the_source_is_refused(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(src / "sub", target_is_directory=True)
    for dst in (src / "out", src / "sub" / "out", tmp_path / "link" / "out"):
        with pytest.raises(UsageError) as e:
            with open_destination(dst, source_root=_dir_id(src)):
                pass
        assert e.value.code == "usage.dst_inside_source", dst
    with open_destination(tmp_path / "out", source_root=_dir_id(src)) as dest:  # beside it is fine
        assert dest.name == "out"


def test_is_within_compares_directory_identities_up_the_descriptor_chain(tmp_path):
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path / "a" / "b" / "c", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert is_within(fd, _dir_id(tmp_path / "a"))
        assert is_within(fd, file_id(fd))
        assert not is_within(fd, _dir_id(tmp_path / "d"))
        (tmp_path / "a").rename(tmp_path / "d" / "a")  # the descriptor follows the directory, not the path
        assert is_within(fd, _dir_id(tmp_path / "d"))
    finally:
        os.close(fd)


def test_a_missing_or_invalid_parent_is_a_usage_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    for dst, code in [(tmp_path / "nope" / "out", "usage.dst_parent_missing"),
                      (tmp_path / "afile" / "out", "usage.dst_parent_missing")]:
        with pytest.raises(UsageError) as e:
            with open_destination(dst):
                pass
        assert e.value.code == code


def test_a_symlink_appearing_while_the_parent_is_opened_is_refused_not_followed(tmp_path, monkeypatch):
    """Between resolving the parent's path and opening it: the open follows no symlink."""
    src, parent = tmp_path / "src", tmp_path / "parent"
    src.mkdir()
    parent.mkdir()
    real = os.path.realpath

    def resolve_then_swap(path, *args, **kwargs):
        resolved = real(path, *args, **kwargs)
        _swap_for_symlink(parent, src)
        return resolved

    monkeypatch.setattr(os.path, "realpath", resolve_then_swap)
    with pytest.raises(UsageError) as e:
        with open_destination(parent / "out", source_root=_dir_id(src)):
            pass
    assert e.value.code == "usage.dst_parent_changed"
    assert list(src.iterdir()) == []


@pytest.mark.parametrize("errno_", [errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_file_system_without_rename_noreplace_is_refused_before_anything_is_written(tmp_path, monkeypatch, errno_):
    """Where renameat2(RENAME_NOREPLACE) is refused (some NFS set-ups), the staging directory's own
    probe refuses at once with a typed error, and leaves nothing behind."""
    import ckptgate.publish as pub

    def refused(*args, **kwargs):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr(pub, "renameat2", refused)
    dst = tmp_path / "out"
    with pytest.raises(RuntimeFailure) as e:
        with open_destination(dst) as dest, staging(dest):
            pytest.fail("the staging directory was handed out on a file system that cannot publish")
    assert e.value.code == "runtime.fs.no_rename_noreplace" and e.value.exit_code == 7
    assert "docs/scale-out.md#file-systems" in e.value.diagnostics()
    assert list(tmp_path.iterdir()) == []


def test_a_rename_that_replaces_despite_noreplace_is_refused(tmp_path, monkeypatch):
    import ckptgate.publish as pub

    def replaces(src_fd, src, dst_fd, dst, flags=0):
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)  # the flag accepted, and ignored

    monkeypatch.setattr(pub, "renameat2", replaces)
    with pytest.raises(RuntimeFailure) as e:
        with open_destination(tmp_path / "out") as dest, staging(dest):
            pytest.fail("the staging directory was handed out on a file system that replaces")
    assert e.value.code == "runtime.fs.no_rename_noreplace"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("refused", ["every lock", "the staging directory's own lock"])
def test_a_file_system_without_flock_is_refused_before_anything_is_written(tmp_path, monkeypatch, refused):
    import types

    import ckptgate.publish as pub

    def flock(fd, op):
        if refused == "every lock" or op == fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        return fcntl.flock(fd, op)

    monkeypatch.setattr(pub, "fcntl", types.SimpleNamespace(**{k: getattr(fcntl, k) for k in dir(fcntl)
                                                               if k.startswith("LOCK_")}, flock=flock))
    dst = tmp_path / "out"
    with pytest.raises(RuntimeFailure) as e:
        with open_destination(dst) as dest, staging(dest):
            pytest.fail("the staging directory was handed out without its lock")
    assert e.value.code == "runtime.fs.no_flock"
    assert list(tmp_path.iterdir()) == []


def test_another_rename_error_in_the_probe_is_not_mistaken_for_a_missing_feature(tmp_path, monkeypatch):
    import ckptgate.publish as pub

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pub, "renameat2", full)
    with pytest.raises(OSError) as e:
        with open_destination(tmp_path / "out") as dest, staging(dest):
            pass
    assert e.value.errno == errno.ENOSPC  # the pipeline maps it to runtime.io, as for any write
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("name", "opened"), [("a" * 300, "usage.dst_unusable"),
                                              ("a" * 300 + "/out", "usage.dst_parent_unusable")])
def test_a_destination_too_long_to_name_is_a_typed_usage_error(tmp_path, name, opened):
    """Path.exists raised ENAMETOOLONG from check_destination, and os.stat from open_destination:
    internal.unexpected (exit 1) where a usage error belongs."""
    for check, code in ((lambda: check_destination(tmp_path / name), "usage.dst_unusable"),
                        (lambda: open_destination(tmp_path / name).__enter__(), opened)):
        with pytest.raises(UsageError) as e:
            check()
        assert e.value.code == code and "too long" in e.value.message
    assert os.listdir(tmp_path) == []
