"""Strict JSON for evidence: exact UTF-8, no duplicate keys, no NaN, bounded size and depth."""

from __future__ import annotations

import json
from typing import Any

from ckptgate.errors import VerificationError

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in any evidence document."""


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _too_deep(node: Any, depth: int) -> bool:
    """True when containers nest deeper than :data:`MAX_DEPTH` (stops descending at the cap)."""
    if depth > MAX_DEPTH:
        return True
    for v in node.values() if isinstance(node, dict) else node:
        if isinstance(v, (dict, list)) and _too_deep(v, depth + 1):
            return True
    return False


def loads_strict(raw: bytes, *, what: str, max_bytes: int) -> Any:
    """Parse ``raw`` as one strict JSON document, in this order of checks.

    1. size (``verify.json.too_large``); 2. UTF-8 (``verify.json.not_utf8``);
    3. syntax (``verify.json.malformed``); 4. duplicate keys anywhere (``verify.json.duplicate_key``);
    5. nesting depth (``verify.json.too_deep``).
    """
    if len(raw) > max_bytes:
        raise VerificationError("verify.json.too_large",
                                f"{what} is {len(raw)} bytes, over the {max_bytes}-byte cap",
                                evidence={"what": what, "size": len(raw), "cap": max_bytes})
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise VerificationError("verify.json.not_utf8", f"{what} is not UTF-8: {e.reason} at byte {e.start}",
                                evidence={"what": what, "offset": e.start}) from None
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except _DuplicateKey as e:
        raise VerificationError("verify.json.duplicate_key", f"{what} repeats the key {e.key!r}",
                                evidence={"what": what, "key": e.key}) from None
    except RecursionError:
        raise VerificationError("verify.json.too_deep", f"{what} nests deeper than the parser allows",
                                evidence={"what": what, "cap": MAX_DEPTH}) from None
    except ValueError as e:
        raise VerificationError("verify.json.malformed", f"{what} is not valid JSON: {e}",
                                evidence={"what": what}) from None
    if isinstance(doc, (dict, list)) and _too_deep(doc, 1):
        raise VerificationError("verify.json.too_deep", f"{what} nests over the cap of {MAX_DEPTH} levels",
                                evidence={"what": what, "cap": MAX_DEPTH})
    return doc
