"""Check a published destination against its receipt, later: the receipt's DSSE signature when
there is one, and every output file's sha256 and size; missing and extra files are reported.

Files that match the receipt beside them show only that the two agree: whoever edited the files could
have rewritten the receipt too.  Only a signature that verifies with a key the caller names says who
wrote the receipt, so a check is :attr:`ReceiptCheck.ok` only with one (:attr:`ReceiptCheck.authenticated`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from ckptgate._json import loads_strict
from ckptgate.errors import UsageError, VerificationError
from ckptgate.publish import RECEIPT_NAME, RECEIPT_PAYLOAD_TYPE, RECEIPT_SIGNATURE_NAME
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.dsse import Envelope, _verifies, pae
from ckptgate.verify.trust import key_algorithm, spki_sha256

MAX_RECEIPT_BYTES = 64 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class FileCheck:
    file: str
    status: str
    """``ok``, ``missing``, ``extra``, ``size_mismatch`` or ``sha256_mismatch``."""
    expected_size: int | None = None
    size: int | None = None
    expected_sha256: str | None = None
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "status": self.status,
            "expected_size": self.expected_size,
            "size": self.size,
            "expected_sha256": self.expected_sha256,
            "sha256": self.sha256,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptCheck:
    destination: str
    signature: str
    """``verified``, ``invalid`` (bad, or not over this receipt), ``missing`` (a key was given, no
    envelope), ``unchecked`` (an envelope, no key) or ``absent`` (neither)."""
    signature_detail: str | None
    files: tuple[FileCheck, ...]
    engine: dict[str, Any] | None = None
    """Which engine the receipt says decided (:func:`engine_of`); authentic only when ``signature``
    is ``verified``."""
    signer: dict[str, str] | None = None
    """The key whose signature over the receipt verified (its file and SPKI SHA-256); ``None``: who
    wrote the receipt is unknown."""

    @property
    def files_match(self) -> bool:
        """Every file is the one the receipt beside it names, and no other is there."""
        return all(f.status == "ok" for f in self.files)

    @property
    def authenticated(self) -> bool:
        """The receipt's signature verified with the key the caller named."""
        return self.signature == "verified"

    @property
    def ok(self) -> bool:
        """The files match a receipt whose signature verified: without a key, never."""
        return self.authenticated and self.files_match

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "ok": self.ok,
            "files_match": self.files_match,
            "authenticated": self.authenticated,
            "signer": self.signer,
            "signature": self.signature,
            "signature_detail": self.signature_detail,
            "files": [f.to_json() for f in self.files],
            "engine": self.engine,
        }


def _read(path: Path, what: str, advice: str) -> bytes:
    try:  # a regular file only: a FIFO would block, /dev/zero never ends
        raw = read_regular_file(path, limit=MAX_RECEIPT_BYTES)
    except OSError as e:
        raise UsageError(
            "usage.receipt_unreadable",
            f"cannot read {what} {path}: {e.strerror}",
            evidence={"path": str(path)},
            advice=advice,
        ) from None
    if len(raw) > MAX_RECEIPT_BYTES:
        raise UsageError(
            "usage.receipt_unreadable",
            f"{what} {path} is over {MAX_RECEIPT_BYTES} bytes",
            evidence={"path": str(path)},
            advice=advice,
        )
    return raw


def _receipt_advice(dst: Path) -> str:
    return (
        f"Name the directory `ckptgate intake ... --out DST` published: it holds {RECEIPT_NAME}, which {dst} "
        f"does not; `ls {dst}` shows what is there."
    )


def _signature(dst: Path, raw: bytes, key: Path | None) -> tuple[str, str | None, dict[str, str] | None]:
    """The signature's state, what it means, and the key that verified it (``None`` unless ``verified``)."""
    env_path = dst / RECEIPT_SIGNATURE_NAME
    if not env_path.is_file():
        if key is not None:
            return "missing", f"--key was given but {RECEIPT_SIGNATURE_NAME} is absent", None
        return "absent", f"the receipt is unsigned (no {RECEIPT_SIGNATURE_NAME}): who wrote it is unknown", None
    try:
        env = Envelope.parse(
            _read(env_path, "the receipt signature", _receipt_advice(dst)), payload_type=RECEIPT_PAYLOAD_TYPE
        )
    except VerificationError as e:
        return "invalid", f"{e.code}: {e.message}", None
    if env.payload != raw:
        return "invalid", f"the envelope is not over the bytes of {RECEIPT_NAME}", None
    if key is None:
        return (
            "unchecked",
            "the receipt's signature was not checked (no --key): who signed it is unknown; "
            "pass --key PUB.pem to check it",
            None,
        )
    try:
        public = serialization.load_pem_public_key(
            _read(
                key, "the public key", f"Pass --key the public key the receipt was signed for ({key} is not readable)."
            )
        )
        key_algorithm(public)  # only the key types a receipt is signed with (Ed25519, ECDSA P-256)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise UsageError(
            "usage.key_invalid",
            f"{key} is not an Ed25519 or ECDSA P-256 PEM public key: {e}",
            advice=f"Pass --key the public key (the .pub.pem `ckptgate attest keygen` wrote), not {key}.",
        ) from None
    message = pae(env.payload_type, env.payload)
    if any(_verifies(public, s.sig, message) for s in env.signatures):  # type: ignore[arg-type]
        return "verified", None, {"key": str(key), "spki_sha256": spki_sha256(public)}  # type: ignore[arg-type]
    return "invalid", f"no signature verifies with {key}", None


def _digest(path: Path, expected_size: int) -> tuple[int, str | None] | None:
    """Size and sha256 of the regular file ``path``; ``None`` for anything else (a symlink, a FIFO, a
    directory, a file that cannot be opened or read), which the check reports as missing.  A file
    whose size is not ``expected_size`` is not hashed (its sha256 is ``None``): it mismatches
    whatever it holds, and a sparse terabyte would otherwise be read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # before fdopen, which raises IsADirectoryError for a directory
            return None
        if st.st_size != expected_size:
            return st.st_size, None
        with os.fdopen(os.dup(fd), "rb") as fh:
            return st.st_size, hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def _outputs(receipt: object) -> dict[str, tuple[int, str]]:
    """The receipt's ``outputs``, by file name; raises ``ValueError`` for any other shape (a name that
    is not a string, a size that is not an integer, a file listed twice)."""
    outputs = receipt.get("outputs") if isinstance(receipt, dict) else None
    if not isinstance(outputs, list):
        raise ValueError("outputs is not a list")
    expected: dict[str, tuple[int, str]] = {}
    for o in outputs:
        if not isinstance(o, dict):
            raise ValueError("an output is not an object")
        name, size, sha = o.get("file"), o.get("size"), o.get("sha256")
        if not isinstance(name, str) or not name or "\0" in name or name in expected:
            raise ValueError("an output's file is not a unique file name")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(sha, str):
            raise ValueError("an output's size or sha256 has the wrong type")
        expected[name] = (size, sha)
    return expected


def engine_of(receipt: object) -> dict[str, Any] | None:
    """The engine a receipt says decided: its ``engine`` record, else (a receipt from before it was
    written) ``remote`` when an input names a remote engine or the decision's engine is a URL,
    ``embedded`` with its ``opa_version`` otherwise; None for a receipt that says neither."""
    if not isinstance(receipt, dict):
        return None
    engine = receipt.get("engine")
    if isinstance(engine, dict) and engine.get("kind") in ("remote", "embedded"):
        return engine
    inputs = receipt.get("inputs")
    for i in inputs if isinstance(inputs, list) else []:
        if isinstance(i, dict) and i.get("role") == "remote_engine":
            return {"kind": "remote", "url": i.get("path"), "revision": i.get("revision")}
    decision = receipt.get("decision")
    name = decision.get("engine") if isinstance(decision, dict) else None
    if not isinstance(name, str):
        return None
    if "://" in name:
        return {"kind": "remote", "url": name, "revision": None}
    return {"kind": "embedded", "opa_version": receipt.get("opa_version")}


def verify_receipt(dst: Path, *, key: Path | None = None) -> ReceiptCheck:
    """Check ``dst`` against its receipt; never raises for a mismatch or an unauthenticated receipt
    (see :attr:`ReceiptCheck.ok`).  Without ``key`` the signature is never checked."""
    if not dst.is_dir():
        raise UsageError("usage.invalid", f"{dst} is not a directory", advice=_receipt_advice(dst))
    raw = _read(dst / RECEIPT_NAME, "the receipt", _receipt_advice(dst))
    try:
        receipt = loads_strict(raw, what="the receipt")
        expected = _outputs(receipt)
    except ValueError:
        raise UsageError(
            "usage.receipt_invalid",
            f"{dst / RECEIPT_NAME} is not a ckptgate receipt",
            advice=f"{dst / RECEIPT_NAME} was not written by `ckptgate intake`: take the checkpoint in again with "
            "`ckptgate intake SRC --out DST` to publish it with a receipt.",
        ) from None
    signature, detail, signer = _signature(dst, raw, key)
    files: list[FileCheck] = []
    present = {e.name for e in os.scandir(dst)} - {RECEIPT_NAME, RECEIPT_SIGNATURE_NAME}
    for name in sorted(expected):
        size_e, sha_e = expected[name]
        path = dst / name
        measured = _digest(path, size_e) if name in present else None
        if measured is None:
            files.append(FileCheck(file=name, status="missing", expected_size=size_e, expected_sha256=sha_e))
            continue
        size, sha = measured
        status = "ok" if (size, sha) == (size_e, sha_e) else "size_mismatch" if size != size_e else "sha256_mismatch"
        files.append(
            FileCheck(file=name, status=status, expected_size=size_e, size=size, expected_sha256=sha_e, sha256=sha)
        )
    files += [FileCheck(file=name, status="extra") for name in sorted(present - set(expected))]
    return ReceiptCheck(
        destination=str(dst),
        signature=signature,
        signature_detail=detail,
        files=tuple(files),
        engine=engine_of(receipt),
        signer=signer,
    )


__all__ = ["FileCheck", "ReceiptCheck", "engine_of", "verify_receipt"]
