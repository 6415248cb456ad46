"""Classify a file by its content (magic bytes), never by its name.

The extension is only compared afterwards: a mismatch is a finding
(``classify.extension_mismatch``); a name can never make content look safer.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.zipcheck import list_zip_names

__all__ = ["EXPECTED_KINDS", "Classification", "FileKind", "classify_file"]

_HEAD = 4096
_PICKLE_PROBE = 4 << 20  # bytes of a file without a protocol header that the pickle oracle reads, at most
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


class FileKind(enum.StrEnum):
    SAFETENSORS = "safetensors"
    JSON = "json"
    TEXT = "text"
    TORCH_ZIP = "torch_zip"
    TORCHSCRIPT = "torchscript"
    LEGACY_TORCH = "legacy_torch"
    PICKLE = "pickle"
    NUMPY = "numpy"
    NPZ = "npz"
    ZIP_STREAM = "zip_stream"  # zips one after another (DCP .distcp), no central directory at the end
    CODE = "code"
    ARCHIVE = "archive"
    EMPTY = "empty"
    UNKNOWN = "unknown"


# extension -> kinds the content may be without a finding
EXPECTED_KINDS: dict[str, frozenset[FileKind]] = {
    ".safetensors": frozenset({FileKind.SAFETENSORS}),
    ".json": frozenset({FileKind.JSON}),
    ".bin": frozenset({FileKind.TORCH_ZIP}),
    ".pt": frozenset({FileKind.TORCH_ZIP}),
    ".pth": frozenset({FileKind.TORCH_ZIP}),
    ".ckpt": frozenset({FileKind.TORCH_ZIP}),
    ".npy": frozenset({FileKind.NUMPY}),
    ".npz": frozenset({FileKind.NPZ}),
    ".txt": frozenset({FileKind.TEXT, FileKind.EMPTY}),
    ".md": frozenset({FileKind.TEXT, FileKind.EMPTY}),
    ".metadata": frozenset({FileKind.PICKLE}),
    ".distcp": frozenset({FileKind.TORCH_ZIP, FileKind.ZIP_STREAM, FileKind.EMPTY}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Classification:
    kind: FileKind
    detail: str  # e.g. "pickle protocol 2", "gzip", "ELF"
    findings: tuple[Finding, ...] = ()


def _archive(head: bytes) -> str | None:
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        return "7z"
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"BZh"):
        return "bzip2"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "zstd"
    if head.startswith(b"Rar!"):
        return "rar"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def _tar_names(src: HashedFile, size: int, limit: int = 64) -> list[str]:
    names: list[str] = []
    off = 0
    while off + 512 <= size and len(names) < limit:
        h = src.pread(512, off)
        if h[257:262] != b"ustar":
            break
        names.append(h[:100].split(b"\x00", 1)[0].decode("latin-1"))
        try:
            n = int(h[124:136].split(b"\x00", 1)[0].strip() or b"0", 8)
        except ValueError:
            break
        off += 512 + (n + 511) // 512 * 512
    return names


def _is_text(b: bytes) -> bool:
    if b"\x00" in b:
        return False
    try:
        b.decode("utf-8")
    except UnicodeDecodeError as e:  # a multi-byte char cut at the head boundary is fine
        return e.start >= len(b) - 4 and e.reason == "unexpected end of data"
    return True


def _looks_like_code(text: str) -> bool:
    for line in text.splitlines()[:200]:
        s = line.strip()
        if s.startswith(("import ", "from ", "def ", "class ", "exec(", "eval(", "__import__")) and (
            s.endswith(":") or " import " in s or s.startswith(("import ", "exec(", "eval(", "__import__"))
        ):
            return True
    return False


class _Reaches(Exception):
    """The stream called something, or asked for a persistent object: ``pickle.load`` would act."""


class _Acts(type):
    """The metaclass of what :class:`_Oracle` hands out for a global: calling it (REDUCE, NEWOBJ,
    OBJ, INST) or touching an attribute of it (BUILD's ``__setstate__``, APPEND's ``append``) is
    the point where a real load would run code, so each stops the run."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _Reaches

    def __getattr__(cls, name: str) -> Any:
        raise _Reaches


class _Global(metaclass=_Acts):
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # NEWOBJ and NEWOBJ_EX call cls.__new__ directly
        raise _Reaches


class _Oracle(pickle.Unpickler):
    """The interpreter's own unpickler, as an oracle that never imports or calls anything.

    ``find_class`` is the only way a pickle obtains a callable (GLOBAL, INST, STACK_GLOBAL and the
    EXT codes all go through it) and ``persistent_load`` the only way it reaches outside itself.
    Here the first hands out :class:`_Global`, which stops the run when it would be called, and
    the second stops it at once. A stream that names a global and never uses it, like a text
    file whose first line starts with ``c``, is not taken for a pickle; a real load of it would
    at most import a module and fail.
    """

    def find_class(self, module: str, name: str) -> Any:
        return _Global

    def persistent_load(self, pid: Any) -> Any:
        raise _Reaches


class _Prefix(io.RawIOBase):
    """The first ``limit`` bytes of ``src``, read on demand (a stream that fails early reads little)."""

    def __init__(self, src: HashedFile, limit: int) -> None:
        self.src, self.limit, self.pos = src, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.limit - self.pos)
        if n <= 0:
            return 0
        data = self.src.pread(n, self.pos)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _unheadered_pickle(src: HashedFile, size: int) -> bool:
    """Whether ``pickle.load`` would reach a callable, or a STOP, from this file's first byte.

    Protocol 0 and 1 pickles are printable text, and any pickle may omit the PROTO header, so
    what a file says it is does not decide this: the interpreter's unpickler does, run as an
    :class:`_Oracle` over at most :data:`_PICKLE_PROBE` bytes (``latin-1``, so no string fails to
    decode where the real load would accept it).  A stream still well-formed where the probe ends
    is treated as a pickle: padding must not carry a call past the probe.
    """
    limit = min(size, _PICKLE_PROBE)
    raw = _Prefix(src, limit)
    try:
        _Oracle(io.BufferedReader(raw, buffer_size=64 << 10), encoding="latin1").load()
    except _Reaches:
        return True
    except Exception:  # a malformed stream: not a pickle, unless the probe cut it short
        return size > limit and raw.pos >= limit
    return True  # reached STOP


def classify_file(src: HashedFile, size: int, path: str) -> Classification:
    """Classify the file ``src`` and compare with its extension."""
    c = _classify(src, size)
    ext = os.path.splitext(path)[1].lower()
    findings = list(c.findings)
    expected = EXPECTED_KINDS.get(ext)
    base = os.path.basename(path)
    if ext == ".py" and c.kind in (FileKind.TEXT, FileKind.EMPTY):
        c = Classification(kind=FileKind.CODE, detail="python source (by extension)", findings=c.findings)
    if expected is not None and c.kind not in expected:
        findings.append(
            error(
                "classify.extension_mismatch",
                path,
                f"named {ext} but the content is {c.kind} ({c.detail})",
                extension=ext,
                kind=str(c.kind),
            )
        )
    if c.kind == FileKind.CODE:
        findings.append(
            error(
                "classify.code",
                path,
                f"code in the checkpoint ({c.detail}); it is never run",
                detail=c.detail,
                name=base,
            )
        )
    return Classification(kind=c.kind, detail=c.detail, findings=tuple(findings))


def _classify(src: HashedFile, size: int) -> Classification:
    if size == 0:
        return Classification(kind=FileKind.EMPTY, detail="empty")
    head = src.pread(min(_HEAD, size), 0)
    if head.startswith(b"\x7fELF"):
        return Classification(kind=FileKind.CODE, detail="ELF binary")
    if head.startswith(b"#!"):
        return Classification(kind=FileKind.CODE, detail="script with a shebang")
    if head.startswith((b"MZ", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")):
        return Classification(kind=FileKind.CODE, detail="native executable")
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        names = list_zip_names(src, size)
        if names is None:
            return Classification(
                kind=FileKind.ZIP_STREAM,
                detail="zip local header without a readable central "
                "directory at the end (concatenated or malformed zips)",
            )
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) == 1:
            top = next(iter(tops))
            rest = {n[len(top) + 1 :] for n in names}
            if "constants.pkl" in rest or any(r.startswith("code/") for r in rest):
                return Classification(kind=FileKind.TORCHSCRIPT, detail="TorchScript archive")
            if "data.pkl" in rest:
                return Classification(kind=FileKind.TORCH_ZIP, detail="torch.save zip")
        if names and all(n.endswith(".npy") for n in names):
            return Classification(kind=FileKind.NPZ, detail="numpy npz")
        return Classification(kind=FileKind.ARCHIVE, detail="zip")
    arch = _archive(head)
    if arch == "tar":
        if {"pickle", "storages"} & {n.strip("./") for n in _tar_names(src, size)}:
            return Classification(kind=FileKind.LEGACY_TORCH, detail="legacy torch tar")
        return Classification(kind=FileKind.ARCHIVE, detail="tar")
    if arch:
        return Classification(kind=FileKind.ARCHIVE, detail=arch)
    if head.startswith(b"\x93NUMPY"):
        return Classification(kind=FileKind.NUMPY, detail="numpy npy")
    if size >= 10 and head[8:9] == b"{" and head[4:8] == b"\x00\x00\x00\x00":
        return Classification(kind=FileKind.SAFETENSORS, detail="safetensors")
    if head[:1] == b"\x80" and len(head) >= 2 and head[1] <= 5:
        if head[2:4] == b"\x8a\x0a" and head[4:14] == _LEGACY_MAGIC:
            return Classification(kind=FileKind.LEGACY_TORCH, detail="legacy torch pickle")
        return Classification(kind=FileKind.PICKLE, detail=f"pickle protocol {head[1]}")
    if size >= 10 and head[8:9] == b"{":
        return Classification(kind=FileKind.SAFETENSORS, detail="safetensors")
    stripped = head.lstrip(b" \t\r\n")
    if stripped[:1] in (b"{", b"[") and _is_text(head):
        return Classification(kind=FileKind.JSON, detail="json")
    if _unheadered_pickle(src, size):
        return Classification(
            kind=FileKind.PICKLE,
            detail="pickle without a protocol header (protocol 0/1 text, or later opcodes with the header left out)",
        )
    if _is_text(head):
        text = head.decode("utf-8", "ignore")
        if _looks_like_code(text):
            return Classification(kind=FileKind.CODE, detail="python source")
        return Classification(kind=FileKind.TEXT, detail="text")
    return Classification(kind=FileKind.UNKNOWN, detail="unknown")
