"""Work and staging directories: where they live, their lifetime locks, the registry, the sweep
of what killed runs left, and ``ckptgate doctor``."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from ckptgate import workdirs
from ckptgate.errors import EngineUnavailable
from ckptgate.publish import open_destination, publish, staging

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ckptgate import workdirs
    from ckptgate.publish import open_destination, staging
    if sys.argv[1] == "work":
        lease = workdirs.create_work_dir()
        (lease.path / "opa.log").write_text("x" * 1000)
        print(lease.path, flush=True)
        time.sleep(120)
    else:
        with open_destination(Path(sys.argv[2])) as dest, staging(dest) as stage:
            (stage.path / "half.safetensors").write_bytes(b"partial" * 1000)
            print(stage.path, flush=True)
            time.sleep(120)
    """)


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path, monkeypatch):
    """$TMPDIR (the fallback parent, and where old versions left ckptgate-opa-*) is this test's own:
    neither the sweep nor doctor ever looks at the machine's /tmp here."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    # and the runtime directory and the registry are this test's own: what earlier tests of this process
    # still hold (a configuration's private copies live as long as the process) is not this test's to count
    run = tmp_path / "xdg-runtime"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp


def _hold(kind: str, dst: Path | None = None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, kind, str(dst or "")], stdout=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    assert line, "the holder did not start"
    return proc, Path(line)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def _registry() -> list[Path]:
    reg = workdirs.registry_dir(create=False)
    return sorted(reg.iterdir())


def _doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "ckptgate", "doctor", "--json", *args], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **(env or {})})
    return out.returncode, json.loads(out.stdout)


# ---- where work directories live ------------------------------------------------------------------------------


def test_work_directories_live_in_a_private_xdg_runtime_dir(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    lease = workdirs.create_work_dir()
    try:
        assert lease.path.parent == run / "ckptgate" and workdirs.WORK.fullmatch(lease.path.name)
        assert os.stat(run / "ckptgate").st_mode & 0o777 == 0o700 and os.stat(lease.path).st_mode & 0o777 == 0o700
        assert (lease.path / workdirs.LOCK_NAME).is_file()
    finally:
        lease.release()
    assert not lease.path.exists() and _registry() == []


@pytest.mark.parametrize("xdg", ["unset", "open to others", "relative"])
def test_without_a_usable_xdg_runtime_dir_a_private_per_user_directory_is_used(tmp_path, monkeypatch, xdg):
    tmp = tmp_path / "tmp"
    if xdg == "unset":
        monkeypatch.delenv("XDG_RUNTIME_DIR")
    elif xdg == "open to others":
        (tmp_path / "run").mkdir(mode=0o755)
        os.chmod(tmp_path / "run", 0o755)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", "run")
    assert workdirs.runtime_dir() == tmp / f"ckptgate-{os.getuid()}"
    assert os.stat(tmp / f"ckptgate-{os.getuid()}").st_mode & 0o777 == 0o700


@pytest.mark.parametrize("hostile", ["symlink", "open to others", "another owner", "a file"])
def test_a_hostile_per_user_directory_is_refused_with_a_typed_error(tmp_path, monkeypatch, hostile):
    tmp = tmp_path / "tmp"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    planted = tmp / f"ckptgate-{os.getuid()}"
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    if hostile == "symlink":
        planted.symlink_to(elsewhere)
    elif hostile == "open to others":
        planted.mkdir()
        os.chmod(planted, 0o777)
    elif hostile == "another owner":
        if os.getuid() != 0:
            pytest.skip("needs root to make a directory another user owns")
        planted.mkdir(mode=0o700)
        os.chown(planted, 4242, 4242)
    else:
        planted.write_text("")
    with pytest.raises(EngineUnavailable) as e:
        workdirs.create_work_dir()
    assert e.value.code == "engine.workdir.unsafe" and e.value.exit_code == 6
    assert list(elsewhere.iterdir()) == []  # nothing was made through the symlink


# ---- the lifetime lock and the sweep --------------------------------------------------------------------------


def test_a_killed_owners_work_directory_is_swept_and_a_live_owners_never_is():
    live, live_dir = _hold("work")
    dead, dead_dir = _hold("work")
    try:
        _kill(dead)
        assert dead_dir.exists() and len(_registry()) == 2
        removed = workdirs.sweep()
        assert dead_dir in removed and not dead_dir.exists()
        assert live_dir.exists() and (live_dir / "opa.log").exists()  # its owner is alive
        assert len(_registry()) == 1
        workdirs.sweep()  # sweeping again changes nothing for the live one
        assert live_dir.exists()
    finally:
        live.kill()
        live.wait()
        workdirs.sweep()
    workdirs.sweep()
    assert not live_dir.exists() and _registry() == []


def test_a_work_directory_created_but_not_yet_locked_is_not_swept(tmp_path, monkeypatch):
    """A creator holds the parent's lock shared from mkdir until its lock file is locked: a sweep
    in that window does nothing; once the creator is gone, a directory without a lock goes."""
    base = workdirs.runtime_dir()
    fresh = base / f"opa-{'0' * 32}"
    fresh.mkdir(mode=0o700)  # created, lock file not yet made
    parent = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(parent, fcntl.LOCK_SH)  # what workdirs.create holds meanwhile
        assert workdirs.sweep_parent(base, "work") == [] and fresh.exists()
    finally:
        os.close(parent)
    assert workdirs.sweep_parent(base, "work") == [fresh] and not fresh.exists()


def test_the_lock_is_not_inherited_by_children(tmp_path):
    """The lock descriptor is O_CLOEXEC: a child that outlives its owner (OPA, the worker) never
    keeps a dead owner's directory alive."""
    lease = workdirs.create_work_dir()
    try:
        child = subprocess.Popen(["sleep", "60"], close_fds=False)
        try:
            fds = {os.readlink(f"/proc/{child.pid}/fd/{n}") for n in os.listdir(f"/proc/{child.pid}/fd")}
            assert str(lease.path / workdirs.LOCK_NAME) not in fds
        finally:
            child.kill()
            child.wait()
    finally:
        lease.release()


def test_a_forked_child_never_releases_its_parents_lease(tmp_path):
    """A process forked from the owner (no exec: a DataLoader worker) inherits the lease object: its release
    (the engine's close at the child's exit) removed the parent's directory under it.  A child holds no
    share unless it takes one (:meth:`Lease.share_after_fork`), and its release does nothing."""
    lease = workdirs.create_work_dir()
    try:
        (lease.path / "bundle.tar.gz").write_bytes(b"x")
        pid = os.fork()
        if pid == 0:
            try:
                lease.release()
            finally:
                os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert (lease.path / "bundle.tar.gz").read_bytes() == b"x"
        assert workdirs.held(lease.path, "work")  # still locked: no sweep takes it
        assert workdirs.sweep() == [] and lease.path.is_dir()
    finally:
        lease.release()
    assert not lease.path.exists()


def test_only_this_users_directories_are_swept():
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory another user owns")
    base = workdirs.runtime_dir()
    foreign = base / f"opa-{'f' * 32}"
    foreign.mkdir()
    os.chown(foreign, 4242, 4242)
    try:
        assert workdirs.sweep_parent(base, "work") == [] and foreign.exists()
    finally:
        os.rmdir(foreign)


def test_a_killed_intakes_staging_directory_is_swept_by_a_run_into_another_destination(tmp_path):
    """The issue's second leftover: a killed intake's partial output beside DST, with no later
    intake into the same parent.  The registry lets a run into any other destination find it."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    dead, stage = _hold("staging", tmp_path / "a" / "out")
    _kill(dead)
    assert stage.exists() and stage.parent == tmp_path / "a"
    with open_destination(tmp_path / "b" / "out") as dest, staging(dest) as other:
        assert not stage.exists()  # swept before this run made its own
        publish(other, {})
    assert list((tmp_path / "a").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["out"]
    assert _registry() == []


def test_a_live_intakes_staging_directory_is_never_swept_from_another_destination(tmp_path):
    (tmp_path / "a").mkdir()
    live, stage = _hold("staging", tmp_path / "a" / "out")
    try:
        with open_destination(tmp_path / "b-out") as dest, staging(dest) as other:
            publish(other, {})
        assert stage.exists() and (stage / "half.safetensors").exists()
    finally:
        live.kill()
        live.wait()
        workdirs.sweep()


def test_a_registry_entry_naming_something_else_removes_nothing(tmp_path):
    """The registry is private, but an entry is still checked: only a directory with the name
    ckptgate gives, owned by us and unlocked, is removed."""
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep").write_text("x")
    reg = workdirs.registry_dir()
    (reg / f"{'a' * 32}.json").write_text(json.dumps({"kind": "staging", "path": str(victim)}))
    (reg / f"{'b' * 32}.json").write_text(json.dumps({"kind": "work", "path": str(victim)}))
    workdirs.sweep()
    assert (victim / "keep").read_text() == "x"


@pytest.mark.parametrize("doc", [
    {"kind": "work", "path": "/tmp/a\u0000b/opa-" + "0" * 32},  # a NUL byte: ValueError from realpath
    {"kind": [], "path": "/tmp/opa-" + "0" * 32},  # an unhashable kind: TypeError from `in`
    {"kind": {"work": 1}, "path": "/tmp/opa-" + "0" * 32},
])
def test_a_corrupt_registry_entry_is_skipped_by_the_sweep_and_doctor(doc):
    """One such entry made every intake and `ckptgate doctor` of this user exit 1 (internal.unexpected)."""
    reg = workdirs.registry_dir()
    (reg / f"{'c' * 32}.json").write_text(json.dumps(doc))
    workdirs.sweep()
    rc, out = _doctor()
    assert rc in (0, 3), out
    assert "error" not in out


def test_a_registry_entry_through_a_symlinked_folder_removes_nothing(tmp_path):
    """An entry whose path reaches a directory with a staging name through a symlinked folder (or
    `..`) is not followed: entries are written canonical, so anything else was not written by us."""
    victim = tmp_path / "victim" / ".data.ckptgate-staging-x"
    victim.mkdir(parents=True)
    (victim / "keep").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "victim", target_is_directory=True)
    reg = workdirs.registry_dir()
    for i, path in enumerate([tmp_path / "link" / victim.name, tmp_path / "victim" / ".." / "victim" / victim.name]):
        (reg / f"{str(i) * 32}.json").write_text(json.dumps({"kind": "staging", "path": str(path)}))
    workdirs.sweep()
    assert (victim / "keep").read_text() == "x"


# ---- ckptgate doctor -------------------------------------------------------------------------------------------


def test_doctor_lists_live_and_stale_leftovers_and_clean_removes_only_the_stale(tmp_path):
    (tmp_path / "a").mkdir()
    live, live_dir = _hold("work")
    dead, dead_dir = _hold("work")
    dead_stager, stage = _hold("staging", tmp_path / "a" / "out")
    try:
        _kill(dead)
        _kill(dead_stager)
        rc, doc = _doctor()
        assert rc == 3 and doc["remaining"] >= 2
        by_path = {item["path"]: item for item in doc["leftovers"]}
        assert by_path[str(live_dir)]["state"] == "live" and not by_path[str(live_dir)]["removable"]
        assert by_path[str(dead_dir)]["state"] == "stale" and by_path[str(dead_dir)]["removable"]
        assert by_path[str(stage)]["kind"] == "staging" and by_path[str(stage)]["state"] == "stale"
        assert by_path[str(stage)]["bytes"] == 7000
        assert {item["kind"] for item in doc["leftovers"]} >= {"work", "staging", "registry"}
        assert dead_dir.exists() and stage.exists()  # listing removes nothing

        rc, doc = _doctor("--clean")
        assert rc == 0 and doc["remaining"] == 0
        assert not dead_dir.exists() and not stage.exists()
        assert live_dir.exists()
        rc, doc = _doctor()
        assert rc == 0 and [item["path"] for item in doc["leftovers"] if item["kind"] == "work"] == [str(live_dir)]
    finally:
        live.kill()
        live.wait()
        workdirs.sweep()


def test_doctor_without_leftovers_says_so():
    out = subprocess.run([sys.executable, "-m", "ckptgate", "doctor"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "no leftovers" in out.stdout


def test_doctor_refuses_a_hostile_work_directory_parent(tmp_path):
    (tmp_path / "tmp" / f"ckptgate-{os.getuid()}").symlink_to(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    out = subprocess.run([sys.executable, "-m", "ckptgate", "doctor", "--json"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 6 and json.loads(out.stdout)["error"]["code"] == "engine.workdir.unsafe"


def test_doctor_removes_old_unlocked_work_directories_only_when_quiet(tmp_path):
    """Work directories of older ckptgate versions have no lock: `--clean` removes one only when
    no process has a file in it open and nothing in it changed for LEGACY_QUIET_S."""
    tmp = tmp_path / "tmp"
    old = time.time() - workdirs.LEGACY_QUIET_S - 60
    dirs = {}
    for name in ("quiet", "fresh", "open"):
        d = tmp / f"ckptgate-opa-{name}"
        d.mkdir(mode=0o700)
        (d / "opa.log").write_text("log")
        (d / "bundle-signing.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
        if name != "fresh":
            for p in (d / "opa.log", d / "bundle-signing.pem", d):
                os.utime(p, (old, old))
        dirs[name] = d
    holder = subprocess.Popen(["sleep", "60"], stdout=open(dirs["open"] / "opa.log", "ab"))  # an old OPA's log
    os.utime(dirs["open"] / "opa.log", (old, old))
    os.utime(dirs["open"], (old, old))
    try:
        rc, doc = _doctor()
        legacy = {Path(item["path"]).name: item for item in doc["leftovers"] if item["kind"] == "legacy"}
        assert rc == 3 and set(legacy) == {"ckptgate-opa-quiet", "ckptgate-opa-fresh", "ckptgate-opa-open"}
        assert [n for n, item in legacy.items() if item["removable"]] == ["ckptgate-opa-quiet"]
        rc, doc = _doctor("--clean")
        assert rc == 0
        assert not dirs["quiet"].exists() and dirs["fresh"].exists() and dirs["open"].exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_destination_reached_through_a_symlinked_parent_is_staged_and_published(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with open_destination(tmp_path / "link" / "out") as dest, staging(dest) as stage:
        (stage.path / "m").write_bytes(b"ok")
        publish(stage, {})
    assert (tmp_path / "real" / "out" / "m").read_bytes() == b"ok"
