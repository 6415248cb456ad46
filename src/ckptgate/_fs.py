"""Linux file-system calls that Python's ``os`` lacks, below every step of the pipeline.

``openat2`` (root-confined path resolution [R35]), ``renameat2`` (a rename relative to directory
descriptors that never replaces its target) and an ancestry test made on descriptors, not paths.
Any step may import this module; it imports nothing from ckptgate.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

__all__ = [
    "RENAME_NOREPLACE",
    "RESOLVE_BENEATH",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_SYMLINKS",
    "file_id",
    "is_within",
    "openat2",
    "renameat2",
]

# linux/openat2.h
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

# linux/fs.h
RENAME_NOREPLACE = 1

# The generic syscall table and x86_64 agree on 437.
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437, "riscv64": 437, "ppc64le": 437, "s390x": 437}.get(
    platform.machine()
)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def openat2(dir_fd: int, path: str, flags: int = os.O_RDONLY, resolve: int = _RESOLVE) -> int:
    """``openat2(dir_fd, path, {flags, 0, resolve})``; raises ``OSError`` with the errno."""
    if _SYS_OPENAT2 is None:
        raise OSError(errno.ENOSYS, "openat2 syscall number unknown on this architecture")
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    raw = os.fsencode(path)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(raw),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return int(fd)


def renameat2(src_dir_fd: int, src: str, dst_dir_fd: int, dst: str, flags: int = RENAME_NOREPLACE) -> None:
    """``renameat2(src_dir_fd, src, dst_dir_fd, dst, flags)``; raises ``OSError`` with the errno.

    ``src`` and ``dst`` are single names: a ``/`` would resolve further, beyond the descriptors.
    """
    for name in (src, dst):
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"renameat2 takes a single name relative to a directory fd, not {name!r}")
    rc = _libc.renameat2(
        ctypes.c_int(src_dir_fd),
        ctypes.c_char_p(os.fsencode(src)),
        ctypes.c_int(dst_dir_fd),
        ctypes.c_char_p(os.fsencode(dst)),
        ctypes.c_uint(flags),
    )
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), dst)


#: ``statfs.f_type`` of the local block and memory file systems, where a read lease is the kernel's
#: own: a write from another host (a network file system, FUSE) could not break it.
LOCAL_FILE_SYSTEMS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0xF2F52010: "f2fs",
}


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 112)]


def fs_magic(fd: int) -> int | None:
    """``fstatfs(fd).f_type``: the file system's magic number, or None when it cannot be read."""
    buf = _StatFs()
    if _libc.fstatfs(ctypes.c_int(fd), ctypes.byref(buf)) != 0:
        return None
    return int(buf.f_type) & 0xFFFFFFFF


def file_id(fd: int) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of an open descriptor."""
    s = os.fstat(fd)
    return s.st_dev, s.st_ino


#: Deeper than any real directory tree; beyond it :func:`is_within` gives up (and says "within").
MAX_ANCESTORS = 4096


def is_within(dir_fd: int, ancestor: tuple[int, int]) -> bool:
    """Whether the directory open as ``dir_fd`` is the directory ``ancestor`` (``(st_dev, st_ino)``)
    or lies beneath it, decided on descriptors: from ``dir_fd``, ``..`` is opened relative to the
    previous descriptor up to the root of this process's file system, comparing each directory's
    identity.  No path is resolved, so no symlink, rename or mount swap between a check and a use
    can make the answer about another directory.  Fails closed: a chain that cannot be followed
    to the root, or that is deeper than :data:`MAX_ANCESTORS`, counts as within.
    """
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # no read permission needed to fstat
    fd = os.open(".", flags, dir_fd=dir_fd)
    try:
        for _ in range(MAX_ANCESTORS):
            here = file_id(fd)
            if here == ancestor:
                return True
            try:
                up = os.open("..", flags, dir_fd=fd)
            except OSError:
                return True  # an ancestor we may not open: cannot prove it is outside
            os.close(fd)
            fd = up
            if file_id(fd) == here:  # ".." of the root is the root
                return False
        return True
    finally:
        os.close(fd)


def boot_id() -> str | None:
    """This kernel's boot id (a host fact, not checkpoint bytes): processes that report the same one
    share the kernel, and so its leases."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None
