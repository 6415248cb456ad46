"""What every zip check shares: the records of a checked zip and a bounded view of its bytes.

:class:`ZipEntry` and :class:`ZipReport` are what :func:`~ckptgate.inspect.zipcheck.check_zip`
returns; ``_Z`` reads ``[base, base + size)`` of a :class:`~ckptgate.inspect.hashed.HashedFile`
with ``pread`` only, refusing any read past the end, and collects each fault as a finding
(``_Z.fail`` records one and stops the check by raising ``_Fail``).  The structure check
(:mod:`ckptgate.inspect.zipcheck`) and the CRC-32 checks (:mod:`ckptgate.inspect.zipcrc`) both read
through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.hashed import HashedFile

__all__ = ["ZipEntry", "ZipReport"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ZipEntry:
    name: str
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int  # relative to the zip's start
    data_offset: int  # relative to the zip's start; from the *local* header's name and extra lengths
    index: int  # position in the central directory (what miniz's file index means)


@dataclass(frozen=True, slots=True, kw_only=True)
class ZipReport:
    entries: tuple[ZipEntry, ...]
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def by_name(self) -> dict[str, ZipEntry]:
        return {e.name: e for e in self.entries}


class _Fail(Exception):
    pass


class _Z:
    def __init__(self, src: HashedFile, base: int, size: int, path: str) -> None:
        self.src, self.base, self.size, self.path = src, base, size, path
        self.findings: list[Finding] = []

    def read(self, off: int, n: int) -> bytes:
        if off < 0 or n < 0 or off + n > self.size:
            self.fail("zip.truncated", "a structure points beyond the end of the zip", offset=off, length=n)
        b = self.src.pread(n, self.base + off)
        if len(b) != n:
            self.fail("zip.truncated", "short read", offset=off, length=n)
        return b

    def err(self, code: str, msg: str, **ev: object) -> None:
        self.findings.append(error(code, self.path, msg, **ev))

    def fail(self, code: str, msg: str, **ev: object) -> None:
        self.err(code, msg, **ev)
        raise _Fail
