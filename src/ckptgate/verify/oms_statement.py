"""What an OMS statement must say, and its binding to the measured files.

The DSSE payload is an in-toto statement of the Model Signing v1.0 predicate type with one subject;
its serialization is ``files``/``sha256`` without ``allow_symlinks``; its ``resources`` name each
file once; and they are exactly the measured files, with the same sha256 (:func:`bind_resources`).
Every refusal is a ``verify.oms.*`` :class:`~ckptgate.errors.VerificationError`.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from ckptgate._json import loads_strict, verify_error
from ckptgate.errors import VerificationError
from ckptgate.verify.dsse import IN_TOTO_PAYLOAD_TYPE
from ckptgate.verify.facts import MAX_PAYLOAD_BYTES
from ckptgate.verify.statement import STATEMENT_TYPE

OMS_PREDICATE_TYPE = "https://model_signing/signature/v1.0"
"""The predicate type of an OpenSSF Model Signing v1.0 signature."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _fail(code: str, message: str, **evidence: Any) -> VerificationError:
    return VerificationError(f"verify.oms.{code}", message, evidence=evidence)


def _statement(doc: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    env = doc["dsseEnvelope"]
    if env.get("payloadType") != IN_TOTO_PAYLOAD_TYPE or not isinstance(env.get("payload"), str):
        raise _fail("payload_type", f"the DSSE payload is not {IN_TOTO_PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(env["payload"], validate=True)
    except (binascii.Error, ValueError):
        raise _fail("payload", "the DSSE payload is not valid base64") from None
    stmt = loads_strict(payload, what="statement", max_bytes=MAX_PAYLOAD_BYTES, error=verify_error)
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise _fail("statement", f"the payload is not an in-toto {STATEMENT_TYPE} statement")
    if stmt.get("predicateType") != OMS_PREDICATE_TYPE:
        raise _fail(
            "predicate_type",
            f"predicate type {str(stmt.get('predicateType'))[:200]!r} is not {OMS_PREDICATE_TYPE}",
            predicate_type=str(stmt.get("predicateType"))[:200],
        )
    subj = stmt.get("subject")
    if not (
        isinstance(subj, list)
        and len(subj) == 1
        and isinstance(subj[0], dict)
        and isinstance(subj[0].get("name"), str)
        and isinstance(subj[0].get("digest"), dict)
    ):
        raise _fail("statement", "an OMS statement has exactly one subject with a name and a digest")
    if not isinstance(stmt.get("predicate"), dict):
        raise _fail("statement", "the statement has no predicate object")
    return stmt, payload


def _serialization(pred: dict[str, Any]) -> dict[str, Any]:
    ser = pred.get("serialization")
    if not isinstance(ser, dict):
        raise _fail("serialization_unsupported", "the predicate has no serialization block")
    if ser.get("method") != "files" or ser.get("hash_type") != "sha256":
        raise _fail(
            "serialization_unsupported",
            f"serialization {ser.get('method')!r}/{ser.get('hash_type')!r} "
            "cannot be reproduced from ckptgate's per-file manifest (only files/sha256)",
            method=str(ser.get("method")),
            hash_type=str(ser.get("hash_type")),
        )
    if ser.get("allow_symlinks") is not False:
        raise _fail(
            "allow_symlinks",
            "the signature was made with allow_symlinks; ckptgate refuses it",
            allow_symlinks=ser.get("allow_symlinks"),
        )
    ignore = ser.get("ignore_paths", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise _fail("serialization_unsupported", "ignore_paths must be a list of strings")
    return ser


def _resources(pred: dict[str, Any]) -> dict[str, str]:
    res = pred.get("resources")
    if not isinstance(res, list) or not res:
        raise _fail("resources", "the predicate has no resources")
    out: dict[str, str] = {}
    for i, r in enumerate(res):
        if not (
            isinstance(r, dict)
            and isinstance(r.get("name"), str)
            and r.get("algorithm") == "sha256"
            and isinstance(r.get("digest"), str)
            and _HEX64.match(r["digest"])
        ):
            raise _fail("resources", f"resource #{i} is not {{name, algorithm: sha256, digest: <64 hex>}}", index=i)
        if r["name"] in out:
            raise _fail("duplicate_resource", f"resource {r['name']!r} is listed twice", name=r["name"])
        out[r["name"]] = r["digest"]
    return out


def _ignored(path: str, ignore_paths: list[str]) -> bool:
    return any(path == p.strip("/") or path.startswith(p.strip("/") + "/") for p in ignore_paths)


def bind_resources(resources: dict[str, str], measured: dict[str, str], ignore_paths: list[str]) -> None:
    """Raise unless ``resources`` (name -> sha256) and the measured files are exactly the same set."""
    unsigned = sorted(set(measured) - set(resources))
    hidden = [p for p in unsigned if _ignored(p, ignore_paths)]
    if hidden:
        raise _fail(
            "ignored_file",
            f"{len(hidden)} file(s) that ckptgate reads are excluded by the signature's "
            f"ignore_paths, so nothing signs them: {hidden[:5]}",
            files=hidden[:20],
        )
    if unsigned:
        raise _fail(
            "unsigned_file",
            f"{len(unsigned)} file(s) of the checkpoint are not in the signature's resources: {unsigned[:5]}",
            files=unsigned[:20],
        )
    missing = sorted(set(resources) - set(measured))
    if missing:
        raise _fail(
            "missing_file",
            f"{len(missing)} signed resource(s) are not in the checkpoint: {missing[:5]}",
            files=missing[:20],
        )
    changed = sorted(p for p in resources if resources[p] != measured[p])
    if changed:
        raise _fail(
            "digest_mismatch",
            f"{len(changed)} file(s) differ from the signed sha256: {changed[:5]}",
            files=changed[:20],
        )
