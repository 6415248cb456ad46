"""Strict zip structure check for torch zips (and any zip we meet), reading with ``pread`` only.

Checks, in order: end-of-central-directory at the very end (no comment, no trailing bytes),
zip64 records consistent, central entries parsed with relative, canonical UTF-8 names that stay
distinct under case folding, Unicode normalisation and path normalisation (the name rules:
:mod:`ckptgate.inspect.zipnames`), each local header matches its central entry (name, flags,
method, sizes), entries are contiguous from offset 0 up to the central directory (no bytes before,
between or after), no encryption or unknown flag bits, no entry marked as a directory by its
external attributes (miniz extracts none of its bytes), data descriptors (torch's writer sets
bit 3) match the central directory, compression ratio capped, and then, unless the caller leaves
it out, each entry's CRC-32 (:mod:`ckptgate.inspect.zipcrc`, which also holds
:class:`DeferredCrcs` for a CRC pass left to a reader that streams every file anyway).  The
alignment padding torch writes sits inside the local extra field, so it is allowed.

The records it returns and the bounded view it reads through are in :mod:`ckptgate.inspect.zipview`;
this module re-exports every name it exported before they moved.
"""

from __future__ import annotations

import struct

from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.zipcrc import CrcMode, DeferredCrcs, _crc, verify_crcs
from ckptgate.inspect.zipnames import _canonical, name_collisions
from ckptgate.inspect.zipview import _Z, ZipEntry, ZipReport, _Fail

__all__ = [
    "CrcMode",
    "DeferredCrcs",
    "ZipEntry",
    "ZipReport",
    "check_zip",
    "list_zip_names",
    "name_collisions",
    "verify_crcs",
]

_EOCD = 0x06054B50
_Z64_EOCD = 0x06064B50
_Z64_LOC = 0x07064B50
_CEN = 0x02014B50
_LOC = 0x04034B50
_DD = 0x08074B50
_ALLOWED_FLAGS = 0x0002 | 0x0004 | 0x0008 | 0x0800
#: The DOS directory bit of a central entry's external attributes.  miniz (torch's reader) treats an
#: entry with it set as a directory, whatever its name, and extracts none of its bytes: torch then
#: returns an uninitialised buffer of the entry's size instead of the stored data.
_DOS_DIRECTORY = 0x10


def _zip64_extra(extra: bytes, usize: int, csize: int, off: int) -> tuple[int, int, int] | None:
    i = 0
    while i + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4 : i + 4 + hlen]
        if hid == 0x0001:
            vals = []
            j = 0
            for v in (usize, csize, off):
                if v == 0xFFFFFFFF:
                    if j + 8 > len(body):
                        return None
                    vals.append(struct.unpack_from("<Q", body, j)[0])
                    j += 8
                else:
                    vals.append(v)
            return vals[0], vals[1], vals[2]
        i += 4 + hlen
    return usize, csize, off


def _eocd(z: _Z) -> tuple[int, int, int]:
    """Returns (entry count, central directory offset, central directory end)."""
    if z.size < 22:
        z.fail("zip.truncated", "too small to be a zip", size=z.size)
    eo = z.size - 22
    rec = z.read(eo, 22)
    sig, disk, cd_disk, n_disk, n, cd_size, cd_off, clen = struct.unpack("<IHHHHIIH", rec)
    if sig != _EOCD:
        tail = z.read(max(0, z.size - 65557), min(z.size, 65557))
        at = tail.rfind(b"PK\x05\x06")
        if at >= 0:
            z.fail(
                "zip.trailing_bytes",
                "bytes or a comment follow the end-of-central-directory record",
                trailing=len(tail) - at - 22,
            )
        z.fail("zip.eocd_missing", "no end-of-central-directory record at the end of the file")
    if clen:
        z.fail("zip.trailing_bytes", "the zip has a comment", comment_length=clen)
    if disk or cd_disk or n_disk != n:
        z.fail("zip.multi_disk", "multi-disk zips are refused")
    cd_end = eo
    if eo >= 20 and struct.unpack("<I", z.read(eo - 20, 4))[0] == _Z64_LOC:
        _, z64_disk, z64_off, ndisks = struct.unpack("<IIQI", z.read(eo - 20, 20))
        if z64_disk != 0 or ndisks != 1:
            z.fail("zip.multi_disk", "multi-disk zip64")
        h = z.read(z64_off, 56)
        (sig64, recsize, _vm, _vn, d64, cd64, n_d64, n64, cd_size64, cd_off64) = struct.unpack("<IQHHIIQQQQ", h)
        if sig64 != _Z64_EOCD or d64 or cd64 or n_d64 != n64:
            z.fail("zip.bad_zip64", "bad zip64 end-of-central-directory record")
        if z64_off + 12 + recsize != eo - 20:
            z.fail("zip.bad_zip64", "bytes between the zip64 record and its locator")
        for small, big in ((n, n64), (cd_size, cd_size64), (cd_off, cd_off64)):
            if small not in (0xFFFF, 0xFFFFFFFF) and small != big:
                z.fail("zip.bad_zip64", "zip64 and classic end records disagree")
        n, cd_size, cd_off, cd_end = n64, cd_size64, cd_off64, z64_off
    elif 0xFFFF in (n,) or 0xFFFFFFFF in (cd_size, cd_off):
        z.fail("zip.bad_zip64", "saturated end record without a zip64 locator")
    if cd_off + cd_size != cd_end:
        z.fail(
            "zip.bad_central_offset",
            "the central directory does not end where the end record starts "
            "(bytes before the first entry, or between the directory and the end record)",
            cd_end=cd_end,
            expected=cd_off + cd_size,
        )
    return n, cd_off, cd_end


MAX_CENTRAL = 512 << 20


def _central(
    z: _Z, n: int, cd_off: int, cd_end: int, max_entries: int
) -> list[tuple[str, int, int, int, int, int, int]]:
    if n > max_entries:
        z.fail("zip.too_many_entries", "the zip declares too many entries", entries=n, limit=max_entries)
    if cd_end - cd_off > MAX_CENTRAL or cd_end < cd_off:
        z.fail("zip.bad_central", "the central directory size is out of bounds", size=cd_end - cd_off)
    out = []
    cd = z.read(cd_off, cd_end - cd_off)
    p = 0
    seen: set[str] = set()
    for _ in range(n):
        if p + 46 > len(cd):
            z.fail("zip.bad_central", "central directory shorter than its entry count")
        (sig, _vm, _vn, flags, method, _t, _d, crc, csize, usize, nlen, elen, clen, disk, _ia, ext_attr, off) = (
            struct.unpack_from("<IHHHHHHIIIHHHHHII", cd, p)
        )
        if sig != _CEN:
            z.fail("zip.bad_central", "bad central directory signature", at=cd_off + p)
        raw = cd[p + 46 : p + 46 + nlen]
        extra = cd[p + 46 + nlen : p + 46 + nlen + elen]
        p += 46 + nlen + elen + clen
        if p > len(cd) or disk:
            z.fail("zip.bad_central", "central directory entry overruns")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            z.fail("zip.bad_name", "entry name is not UTF-8", name=raw.hex())
        if (
            not name
            or name.startswith("/")
            or "\\" in name
            or "\x00" in name
            or ".." in name.split("/")
            or (len(name) > 1 and name[1] == ":")
        ):
            z.fail("zip.unsafe_name", "entry name is absolute or escapes the archive", name=name)
        if not _canonical(name):
            z.fail(
                "zip.noncanonical_name",
                "entry name has an empty or '.' path segment (a//b, a/./b, a "
                "trailing slash): readers normalise it differently",
                name=name,
            )
        if ext_attr & _DOS_DIRECTORY:
            z.fail(
                "zip.directory_entry",
                "entry is marked as a directory in its external attributes: torch's "
                "reader (miniz) extracts none of its bytes",
                name=name,
                external_attributes=ext_attr,
            )
        if name in seen:
            z.fail("zip.duplicate_name", "two entries have the same name", name=name)
        seen.add(name)
        z64 = _zip64_extra(extra, usize, csize, off)
        if z64 is None:
            z.fail("zip.bad_zip64", "truncated zip64 extra field", name=name)
            break  # not reached: fail raises
        usize, csize, off = z64
        out.append((name, flags, method, crc, csize, usize, off))
    if p != len(cd):
        z.fail("zip.bad_central", "bytes left in the central directory after its entries")
    for fold, first, second in name_collisions([c[0] for c in out]):
        z.err(
            "zip.name_collision",
            f"two entry names are the same under {fold} folding or normalisation: "
            "which one a reader opens is the reader's choice",
            fold=fold,
            names=[first, second],
        )
    return out


def _descriptor(z: _Z, at: int, crc: int, csize: int, usize: int, limit: int) -> int:
    for sig in (True, False):
        for wide in (False, True):
            fmt = "<I" + ("QQ" if wide else "II")
            n = struct.calcsize(fmt) + (4 if sig else 0)
            if at + n > limit:
                continue
            b = z.read(at, n)
            if sig:
                if struct.unpack_from("<I", b)[0] != _DD:
                    continue
                b = b[4:]
            if struct.unpack(fmt, b) == (crc, csize, usize):
                return n
    z.fail("zip.descriptor_mismatch", "the data descriptor does not match the central directory", at=at)
    return 0  # unreachable


def check_zip(
    src: HashedFile,
    size: int,
    *,
    path: str,
    base: int = 0,
    verify_crc: bool = True,
    max_ratio: int = 100,
    max_entries: int = 1_000_000,
    stored_only: bool = False,
) -> ZipReport:
    """Check the zip occupying ``[base, base + size)`` of ``src``."""
    z = _Z(src, base, size, path)
    entries: list[ZipEntry] = []
    try:
        n, cd_off, cd_end = _eocd(z)
        cen = _central(z, n, cd_off, cd_end, max_entries)
        cursor = 0
        for index, (name, flags, method, crc, csize, usize, off) in sorted(enumerate(cen), key=lambda t: t[1][6]):
            if off != cursor:
                z.fail(
                    "zip.gap" if off > cursor else "zip.overlap",
                    "bytes before or between entries" if off > cursor else "entries overlap",
                    name=name,
                    offset=off,
                    expected=cursor,
                )
            (sig, _v, lflags, lmethod, _t, _d, lcrc, lcs, lus, nlen, elen) = struct.unpack(
                "<IHHHHHIIIHH", z.read(off, 30)
            )
            if sig != _LOC:
                z.fail("zip.bad_local", "bad local header signature", name=name, offset=off)
            lname = z.read(off + 30, nlen)
            if lname != name.encode("utf-8"):
                z.fail(
                    "zip.name_mismatch",
                    "local header name differs from the central directory",
                    central=name,
                    local=lname.decode("utf-8", "replace"),
                )
            if lflags != flags:
                z.fail("zip.flag_mismatch", "local and central flags differ", name=name, local=lflags, central=flags)
            if flags & 0x0001 or flags & 0x0040:
                z.fail("zip.encrypted", "entry is encrypted", name=name)
            if flags & ~_ALLOWED_FLAGS:
                z.fail("zip.unknown_flags", "entry has unknown flag bits", name=name, flags=flags)
            if lmethod != method:
                z.fail("zip.method_mismatch", "local and central compression methods differ", name=name)
            if method not in (0, 8):
                z.fail(
                    "zip.unsupported_method",
                    "compression method is neither stored nor deflate",
                    name=name,
                    method=method,
                )
            if stored_only and method != 0:
                z.fail("zip.compressed", "a torch zip entry is compressed; torch writes stored entries only", name=name)
            if method == 0 and csize != usize:
                z.fail("zip.size_mismatch", "a stored entry's sizes differ", name=name)
            if usize > max_ratio * max(csize, 1) and usize > 1 << 20:
                z.fail(
                    "zip.compression_ratio",
                    "entry's compression ratio exceeds the cap (zip bomb)",
                    name=name,
                    size=usize,
                    compressed=csize,
                    limit=max_ratio,
                )
            lextra = z.read(off + 30 + nlen, elen)
            lz = _zip64_extra(lextra, lus, lcs, 0)
            if flags & 0x0008:
                if (lcrc, lcs, lus) != (0, 0, 0) and (lcrc, lz and lz[1], lz and lz[0]) != (crc, csize, usize):
                    z.fail("zip.size_mismatch", "local header values disagree with the central directory", name=name)
            elif lz is None or (lcrc, lz[1], lz[0]) != (crc, csize, usize):
                z.fail("zip.size_mismatch", "local header values disagree with the central directory", name=name)
            data = off + 30 + nlen + elen
            end = data + csize
            if end > cd_off:
                z.fail("zip.overlap", "entry data runs into the central directory", name=name)
            if flags & 0x0008:
                end += _descriptor(z, end, crc, csize, usize, cd_off)
            cursor = end
            entries.append(
                ZipEntry(
                    name=name,
                    flags=flags,
                    method=method,
                    crc=crc,
                    compressed_size=csize,
                    size=usize,
                    header_offset=off,
                    data_offset=data,
                    index=index,
                )
            )
        if cursor != cd_off:
            z.fail(
                "zip.gap",
                "bytes between the last entry and the central directory",
                end=cursor,
                central_directory=cd_off,
            )
        if verify_crc:
            for e in entries:
                _crc(z, e)
    except _Fail:
        pass
    # central directory order: torch derives the archive's prefix from entry 0
    return ZipReport(entries=tuple(sorted(entries, key=lambda e: e.index)), findings=tuple(z.findings))


def list_zip_names(
    src: HashedFile, size: int, *, base: int = 0, max_entries: int = 1_000_000
) -> tuple[str, ...] | None:
    """Central directory names, or ``None`` when the directory cannot be read."""
    z = _Z(src, base, size, "")
    try:
        n, cd_off, cd_end = _eocd(z)
        return tuple(c[0] for c in _central(z, n, cd_off, cd_end, max_entries))
    except _Fail:
        return None
