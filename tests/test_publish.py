"""Atomic publication: DST is absent or complete; never replaced; stale staging cleaned."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ckptgate.errors import UsageError
from ckptgate.publish import RECEIPT_NAME, publish, remove_stale_staging, staging


def test_publish_renames_staging_into_place(tmp_path):
    dst = tmp_path / "out"
    with staging(dst) as stage:
        (stage / "model.safetensors").write_bytes(b"x")
        publish(stage, dst, {"decision_id": "d"})
    assert (dst / "model.safetensors").read_bytes() == b"x"
    assert json.loads((dst / RECEIPT_NAME).read_text())["decision_id"] == "d"
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_existing_dst_is_refused_before_any_work(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("precious")
    with pytest.raises(UsageError) as e:
        with staging(dst):
            pass
    assert e.value.code == "usage.dst_exists"
    assert (dst / "keep").read_text() == "precious"


def test_dst_appearing_during_the_run_is_not_replaced(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(UsageError) as e:
        with staging(dst) as stage:
            dst.mkdir()
            (dst / "keep").write_text("precious")
            publish(stage, dst, {})
    assert e.value.code == "usage.dst_exists"
    assert (dst / "keep").read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_failure_leaves_no_dst_and_no_staging(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staging(dst) as stage:
            (stage / "half").write_bytes(b"partial")
            raise RuntimeError("boom")
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_kill_9_before_rename_leaves_dst_absent_and_is_cleaned_next_time(tmp_path):
    dst = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from ckptgate.publish import staging
        with staging(Path({str(dst)!r})) as stage:
            (stage / "half.safetensors").write_bytes(b"partial")
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    assert proc.wait() == -9
    assert not dst.exists()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".out.ckptgate-staging-")
    with staging(dst) as stage:
        (stage / "m").write_bytes(b"ok")
        publish(stage, dst, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_live_staging_directory_of_another_intake_is_left_alone(tmp_path):
    """Two intakes into the same parent: the second never removes the first's staging directory."""
    with staging(tmp_path / "first") as first:
        (first / "part").write_bytes(b"in progress")
        with staging(tmp_path / "second") as second:
            assert first.exists() and (first / "part").read_bytes() == b"in progress"
            publish(second, tmp_path / "second", {})
        publish(first, tmp_path / "first", {})
    assert (tmp_path / "first" / "part").read_bytes() == b"in progress"


def test_a_staging_directory_not_yet_locked_by_its_intake_is_not_taken_for_stale(tmp_path):
    """Between mkdtemp and flock an intake holds its parent's lock shared: no clean-up runs then."""
    fresh = tmp_path / ".out.ckptgate-staging-abc123"
    fresh.mkdir()  # created, not yet locked
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(parent, fcntl.LOCK_SH)  # what staging() holds while it creates and locks
        assert remove_stale_staging(tmp_path) == [] and fresh.exists()
    finally:
        os.close(parent)
    assert remove_stale_staging(tmp_path) == [fresh] and not fresh.exists()  # an owner that is gone
