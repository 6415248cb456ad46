"""One strict JSON parser for untrusted bytes, below every step of the pipeline.

Exact UTF-8, no duplicate keys, no ``NaN``/``Infinity`` (nor a number that overflows to it), no lone
surrogate (``"\\ud800"``), a size cap and a nesting cap.  A refusal is a
:class:`JSONRejected` (a ``ValueError``) naming its ``kind``; a caller that reports a typed error of its
own passes ``error``, which turns the refusal into that error (:func:`verify_error` gives the
``verify.json.*`` codes).  Any step may import this module; it imports nothing from ckptgate but
:mod:`ckptgate.errors`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from ckptgate.errors import UsageError, VerificationError

__all__ = ["MAX_DEPTH", "JSONRejected", "depth", "loads_or_none", "loads_strict", "usage_error", "verify_error"]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted by default."""


class JSONRejected(ValueError):
    """Why a document was refused.  ``kind`` is one of ``too_large``, ``not_utf8``, ``malformed``,
    ``duplicate_key`` and ``too_deep``; ``detail`` holds the facts of that kind (``size`` and ``cap``,
    ``offset``, ``key``, ``cap``); ``message`` names the document as the caller did (``what``);
    ``reason`` is the same without the name (for ``malformed``, the scanner's own words)."""

    def __init__(self, kind: str, message: str, *, what: str, reason: str = "", **detail: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.what = what
        self.reason = reason or message
        self.detail = detail


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent, refused when it overflows a double (``1e400``):
    Python would read it as ``inf``, the value that ``Infinity`` spells and no strict JSON holds."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a double")
    return value


#: A surrogate code point (U+D800..U+DFFF), as a character of text.  In JSON text it can only come from
#: an escape: Python's scanner joins a high escape followed by a low one into one character, and keeps
#: any other (a high without a low, a low alone) as a lone surrogate, which is no Unicode scalar value.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What could produce one: a ``\uD800``-``\uDFFF`` escape (any case), or a surrogate in text the caller decoded.
_MAY_HOLD_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def _lone_surrogate(doc: Any) -> str | None:
    """The first string or key of ``doc`` that holds a lone surrogate, else ``None``.  Iterative."""
    stack: list[Any] = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def depth(doc: Any, cap: int | None = None) -> int:
    """Nesting depth of a parsed JSON value (containers only; a scalar is 0).  Iterative; with ``cap``
    it stops as soon as the depth passes ``cap`` and returns ``cap + 1``."""
    best = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        best = max(best, d)
        if cap is not None and best > cap:
            return cap + 1
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return best


def _parse(raw: bytes | str, what: str, max_bytes: int | None, max_depth: int | None) -> Any:
    if isinstance(raw, bytes):
        if max_bytes is not None and len(raw) > max_bytes:
            raise JSONRejected(
                "too_large",
                f"{what} is {len(raw)} bytes, over the {max_bytes}-byte cap",
                what=what,
                size=len(raw),
                cap=max_bytes,
            )
        try:
            text = raw.decode("utf-8", errors="strict")
        except UnicodeDecodeError as e:
            raise JSONRejected(
                "not_utf8", f"{what} is not UTF-8: {e.reason} at byte {e.start}", what=what, offset=e.start
            ) from None
    else:
        text = raw
        n = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if max_bytes is not None and n > max_bytes:
            raise JSONRejected(
                "too_large", f"{what} is {n} bytes, over the {max_bytes}-byte cap", what=what, size=n, cap=max_bytes
            )
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite)
    except _DuplicateKey as e:
        raise JSONRejected("duplicate_key", f"{what} repeats the key {e.key!r}", what=what, key=e.key) from None
    except RecursionError:  # the C scanner stops at the interpreter's recursion limit
        raise JSONRejected(
            "too_deep",
            f"{what} nests deeper than the parser allows",
            what=what,
            cap=max_depth if max_depth is not None else MAX_DEPTH,
        ) from None
    except ValueError as e:
        raise JSONRejected("malformed", f"{what} is not valid JSON: {e}", what=what, reason=str(e)) from None
    if max_depth is not None and isinstance(doc, (dict, list)) and depth(doc, max_depth) > max_depth:
        raise JSONRejected("too_deep", f"{what} nests over the cap of {max_depth} levels", what=what, cap=max_depth)
    if _MAY_HOLD_SURROGATE.search(text):  # the walk only where an escape (or the text) could hold one
        bad = _lone_surrogate(doc)
        if bad is not None:
            at = _SURROGATE.search(bad)
            assert at is not None
            reason = f"a string holds the lone surrogate U+{ord(at.group()):04X}, which is no Unicode character"
            raise JSONRejected("malformed", f"{what} is not valid JSON: {reason}", what=what, reason=reason)
    return doc


def loads_strict(
    raw: bytes | str,
    *,
    what: str,
    max_bytes: int | None = None,
    max_depth: int | None = MAX_DEPTH,
    error: Callable[[JSONRejected], Exception] | None = None,
) -> Any:
    """Parse ``raw`` as one strict JSON document, in this order of checks.

    1. size, when ``max_bytes`` is given (``too_large``); 2. UTF-8, for bytes (``not_utf8``; text the
    caller decoded skips it); 3. syntax, ``NaN``/``Infinity`` and numbers that overflow a double (``1e400``) included
    (``malformed``); 4. duplicate keys
    anywhere (``duplicate_key``); 5. nesting deeper than ``max_depth``, when given (``too_deep``); 6. a lone
    surrogate (a high ``\\uD800``-``\\uDBFF`` escape not followed by a low one, a low one alone) in any string or
    key (``malformed``, as strict parsers see it: no Unicode scalar value).
    A refusal raises ``error(rejection)`` when ``error`` is given, else the :class:`JSONRejected`.
    """
    try:
        return _parse(raw, what, max_bytes, max_depth)
    except JSONRejected as r:
        if error is None:
            raise
        raise error(r) from None


def loads_or_none(raw: bytes | str) -> Any:
    """``raw`` parsed as JSON where a reader takes what it can, else ``None``: not UTF-8, not JSON, or nested
    past the parser's recursion limit (``RecursionError``, no ``ValueError``).  A JSON ``null`` is ``None``
    too: a caller checks the type it needs.  A document that decides is read by :func:`loads_strict`."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def verify_error(r: JSONRejected) -> VerificationError:
    """The evidence codes: ``verify.json.<kind>``, with ``what`` and the detail as evidence."""
    return VerificationError(f"verify.json.{r.kind}", r.message, evidence={"what": r.what, **r.detail})


def usage_error(r: JSONRejected) -> UsageError:
    """For a file the user passes as a flag (the producer's own input, not evidence): ``usage.json.<kind>``,
    exit 2, with ``what`` and the detail as evidence."""
    return UsageError(
        f"usage.json.{r.kind}",
        r.message,
        evidence={"what": r.what, **r.detail},
        advice=f"Fix the {r.what} so that it is one strict JSON document (no NaN, no repeated key), then run again.",
    )
