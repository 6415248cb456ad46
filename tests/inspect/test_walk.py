"""SafeTree: root-confined walk with openat2, refusals as findings, limits as errors."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from ckptgate.errors import InputRejected
from ckptgate.inspect.walk import SafeTree, WalkLimits, openat2

from ckpt_inspect_helpers import write


def _codes(tree: SafeTree) -> dict[str, str]:
    return {f.path: f.code for f in tree.findings}


def test_regular_files_listed_with_posix_relative_paths(tmp_path: Path) -> None:
    write(tmp_path, "a.json", "{}")
    write(tmp_path, "sub/b.bin", b"xyz")
    with SafeTree.open(tmp_path) as t:
        assert [(e.path, e.size) for e in t.entries] == [("a.json", 2), ("sub/b.bin", 3)]
        fd = t.open_file("sub/b.bin")
        try:
            assert os.read(fd, 10) == b"xyz"
        finally:
            os.close(fd)
        assert t.findings == ()


def test_symlink_out_of_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    (root / "escape").symlink_to("/etc/passwd")
    with SafeTree.open(root) as t:
        assert t.entries == ()
        assert _codes(t) == {"escape": "walk.symlink"}


def test_symlink_loop_is_refused_without_hanging(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with SafeTree.open(tmp_path) as t:
        assert _codes(t) == {"a": "walk.symlink", "b": "walk.symlink"}


def test_proc_magic_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "magic").symlink_to("/proc/self/root/etc/hostname")
    with SafeTree.open(tmp_path) as t:
        assert _codes(t) == {"magic": "walk.symlink"}
    # and openat2 itself refuses to cross a magic link even when asked directly
    fd = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as e:
            os.close(openat2(fd, "root/etc/hostname", os.O_RDONLY))
        assert e.value.errno in (errno.ELOOP, errno.EXDEV)
    finally:
        os.close(fd)


def test_openat2_refuses_dotdot_escape(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as e:
            openat2(fd, "../etc/hostname", os.O_RDONLY)
        assert e.value.errno == errno.EXDEV
    finally:
        os.close(fd)


def test_fifo_is_refused_and_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with SafeTree.open(tmp_path) as t:
        assert _codes(t) == {"pipe": "walk.fifo"}


def test_socket_is_refused(tmp_path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "sock"))
        with SafeTree.open(tmp_path) as t:
            assert _codes(t) == {"sock": "walk.socket"}
    finally:
        s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_char_device_is_refused(tmp_path: Path) -> None:
    os.mknod(tmp_path / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    with SafeTree.open(tmp_path) as t:
        assert _codes(t) == {"null": "walk.char_device"}


def test_hardlink_is_an_error_finding(tmp_path: Path) -> None:
    write(tmp_path, "a.bin", b"1")
    os.link(tmp_path / "a.bin", tmp_path / "b.bin")
    with SafeTree.open(tmp_path) as t:
        assert _codes(t) == {"a.bin": "walk.hardlink", "b.bin": "walk.hardlink"}


def test_non_utf8_name_is_refused(tmp_path: Path) -> None:
    with open(os.path.join(os.fsencode(tmp_path), b"bad\xff.bin"), "wb") as f:
        f.write(b"x")
    with SafeTree.open(tmp_path) as t:
        assert t.entries == ()
        assert [f.code for f in t.findings] == ["walk.name_not_utf8"]


def test_case_collision(tmp_path: Path) -> None:
    write(tmp_path, "Model.bin", b"1")
    write(tmp_path, "model.bin", b"2")
    with SafeTree.open(tmp_path) as t:
        assert [f.code for f in t.findings] == ["walk.name_collision"]


def test_unicode_normalisation_collision(tmp_path: Path) -> None:
    write(tmp_path, "caf\u00e9.json", "{}")  # NFC
    write(tmp_path, "cafe\u0301.json", "{}")  # NFD
    with SafeTree.open(tmp_path) as t:
        assert [f.code for f in t.findings] == ["walk.name_collision"]


def test_huge_file_count_is_refused(tmp_path: Path) -> None:
    for i in range(30):
        write(tmp_path, f"f{i}", b"")
    with pytest.raises(InputRejected) as e:
        SafeTree.open(tmp_path, WalkLimits(max_files=25))
    assert e.value.code == "input.walk.too_many_files"


def test_depth_limit(tmp_path: Path) -> None:
    write(tmp_path, "a/b/c/d/e.txt", "x")
    with pytest.raises(InputRejected) as e:
        SafeTree.open(tmp_path, WalkLimits(max_depth=2))
    assert e.value.code == "input.walk.too_deep"


def test_total_size_limit(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 40)  # a sparse terabyte behind nothing
    with pytest.raises(InputRejected) as e:
        SafeTree.open(tmp_path, WalkLimits(max_total_bytes=1 << 30))
    assert e.value.code == "input.walk.too_large"


def test_name_length_limit(tmp_path: Path) -> None:
    write(tmp_path, "x" * 40, b"")
    with SafeTree.open(tmp_path, WalkLimits(max_name_bytes=32)) as t:
        assert [f.code for f in t.findings] == ["walk.name_too_long"]


def test_file_swapped_after_walk_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "w.bin", b"original")
    with SafeTree.open(tmp_path) as t:
        os.unlink(tmp_path / "w.bin")
        (tmp_path / "w.bin").symlink_to("/etc/passwd")
        with pytest.raises(InputRejected) as e:
            t.open_file("w.bin")
        assert e.value.code == "input.walk.open_refused"
        os.unlink(tmp_path / "w.bin")
        write(tmp_path, "w.bin", b"replaced!")
        with pytest.raises(InputRejected) as e2:
            t.open_file("w.bin")
        assert e2.value.code == "input.walk.changed"


def test_only_walked_paths_can_be_opened(tmp_path: Path) -> None:
    write(tmp_path, "a", b"1")
    with SafeTree.open(tmp_path) as t, pytest.raises(InputRejected) as e:
        t.open_file("../a")
    assert e.value.code == "input.walk.not_in_tree"


def test_root_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(InputRejected) as e:
        SafeTree.open(tmp_path / "link")
    assert e.value.code == "input.walk.root_unreadable"


def test_openat2_unavailable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckptgate.inspect.walk as walk

    def enosys(*a: object, **k: object) -> int:
        raise OSError(errno.ENOSYS, "no openat2")

    monkeypatch.setattr(walk, "openat2", enosys)
    with pytest.raises(InputRejected) as e:
        SafeTree.open(tmp_path)
    assert e.value.code == "input.walk.openat2_unavailable"


_OPEN_FOR_WRITING = "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); print('opened', flush=True)"


def test_hold_leases_every_file_and_notices_an_open_for_writing(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    write(tmp_path, "a.bin", b"a" * 10)
    write(tmp_path, "sub/b.bin", b"b" * 10)
    with SafeTree.open(tmp_path) as t:
        assert t.hold() and t.held and t.intact()
        fd = t.open_file("a.bin")  # the held description itself
        try:
            assert os.pread(fd, 3, 0) == b"aaa"
        finally:
            os.close(fd)
        assert t.intact()
        writer = subprocess.Popen([sys.executable, "-c", _OPEN_FOR_WRITING, str(tmp_path / "sub" / "b.bin")],
                                  stdout=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while t.intact() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert t.held and not t.intact()  # still held, but broken
        assert writer.poll() is None  # the writer waits for the lease to go
    # closing the tree releases the leases: the writer gets its descriptor at once
    assert writer.communicate(timeout=10)[0] == b"opened\n"


def test_hold_is_refused_while_a_file_is_open_for_writing(tmp_path: Path) -> None:
    write(tmp_path, "a.bin", b"a")
    write(tmp_path, "b.bin", b"b")
    wfd = os.open(tmp_path / "b.bin", os.O_WRONLY)
    try:
        with SafeTree.open(tmp_path) as t:
            assert not t.hold() and not t.held and not t.intact()
            fd = t.open_file("a.bin")  # reads still work, unheld
            os.close(fd)
    finally:
        os.close(wfd)


def test_hold_off_the_main_thread_holds_nothing(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    write(tmp_path, "a.bin", b"a")
    with SafeTree.open(tmp_path) as t, ThreadPoolExecutor(1) as pool:
        assert pool.submit(t.hold).result() is False
        assert not t.intact()


def test_hold_does_not_take_more_than_half_the_descriptor_limit(tmp_path: Path) -> None:
    """Where even the hard limit is too low, hold() gives up (and inspection stays bound by the
    read ledger, the copy by hashing every source)."""
    import subprocess
    import sys

    for i in range(40):
        write(tmp_path, f"f{i:02}.bin", b"x")
    code = ("import os, resource, sys; from pathlib import Path; from ckptgate.inspect import SafeTree\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
            "t = SafeTree.open(Path(sys.argv[1])); print(t.hold(), t.held, t.intact())\n"
            "os.close(t.open_file('f39.bin'))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False", "False"], out.stderr  # 40 files > 64 // 2


def test_a_tree_without_files_is_refused_as_empty(tmp_path: Path) -> None:
    (tmp_path / "only" / "dirs").mkdir(parents=True)
    with SafeTree.open(tmp_path) as t:
        assert t.entries == ()
        assert [(f.code, f.severity.value) for f in t.findings] == [("walk.empty", "error")]


def test_a_tree_whose_only_entry_was_refused_is_not_also_empty(tmp_path: Path) -> None:
    (tmp_path / "escape").symlink_to("/etc/passwd")
    with SafeTree.open(tmp_path) as t:
        assert [f.code for f in t.findings] == ["walk.symlink"]


def test_hold_raises_the_descriptor_limit_for_a_tree_of_many_files(tmp_path):
    """Issue 16 F1: with the common soft limit of 1024, 600 files used to make hold() give up."""
    import resource
    import subprocess
    import sys

    root = tmp_path / "many"
    root.mkdir()
    for i in range(600):
        (root / f"f{i:03d}.json").write_text("{}")
    code = ("import resource, sys; from pathlib import Path; from ckptgate.inspect import SafeTree\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))\n"
            "t = SafeTree.open(Path(sys.argv[1])); print(t.hold(), t.intact())")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the hard descriptor limit here is {hard}")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_hold_is_refused_on_a_file_system_that_is_not_local(tmp_path: Path, monkeypatch) -> None:
    """On a network file system or FUSE a kernel may grant a lease that a write from another host
    never breaks: hold takes nothing there, and the copy hashes every byte it reads instead."""
    import ckptgate.inspect.walk as walk

    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    monkeypatch.setattr(walk, "fs_magic", lambda fd: 0x6969)  # NFS_SUPER_MAGIC
    with SafeTree.open(tmp_path) as t:
        assert not t.hold() and not t.held
    monkeypatch.setattr(walk, "fs_magic", lambda fd: 0xEF53)  # ext4, as here
    with SafeTree.open(tmp_path) as t:
        assert t.hold() and t.held
