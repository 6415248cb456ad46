"""Claims-lint suppressions: an inline comment with its reason, or a per-path ignore in ``ckptgate.toml``.

Inline, in Markdown (the reason is required)::

    <!-- ckptgate: allow claims_support_not_in_matrix — our fork's README quotes upstream verbatim -->

on a line of its own, it covers the paragraph (or list item, or table row) that follows; at the end
of a line of text, the paragraph that line is in.  ``--`` or ``:`` may stand for the dash.  A
comment without a reason, or naming no claims code, suppresses nothing and is itself a violation
(``claims_suppression_invalid``).  ``claims_ignore`` in the configuration covers every sentence of
the files a glob matches, for the codes it lists, with its reason.

Nothing is dropped: a suppressed violation stays in the report, as a SARIF ``suppressions`` entry
(``inSource`` or ``external``) with its justification, is counted in the summary and does not fail
the check.  A suppression the change under review adds loosens the check: ``check --base`` reports it
as widening (:mod:`ckptgate.evidence.widening_check`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MARKER", "Suppression", "apply", "ignores", "inline", "invalid"]

MARKER = "ckptgate: allow"
_COMMENT = re.compile(
    r"<!--\s*ckptgate:\s*allow\b\s*(?P<code>[\w.]*)\s*(?:(?:[\u2014\u2013]|--?|:)\s*(?P<reason>.*?))?\s*-->",
    re.IGNORECASE,
)
_CODE = re.compile(r"^(?:check\.claims\.)?(claims_[a-z_]+)$")
#: An inline code span: a comment written inside one is shown as text, never a suppression.
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Suppression:
    """One suppression: which code it covers, where (``file`` lines ``first``-``last``), why, and its kind."""

    file: str
    line: int
    first: int
    last: int
    code: str
    reason: str
    kind: str = "inSource"

    def covers(self, v: dict[str, Any]) -> bool:
        loc = v.get("location") or {}
        return (
            v.get("code") == self.code
            and loc.get("file") == self.file
            and self.first <= int(loc.get("line") or 0) <= self.last
        )

    def key(self) -> tuple[str, str]:
        return (self.file, self.code)


def _paragraph(lines: Sequence[str], start: int) -> int:
    """The last line (1-based) of the paragraph that starts at or after line ``start``."""
    n = start
    while n < len(lines) and lines[n].strip() and not re.match(r"\s*(?:[-*+]\s|\d+[.)]\s|#|\|)", lines[n]):
        n += 1
    return n


def inline(text: str, *, file: str) -> tuple[list[Suppression], list[dict[str, Any]]]:
    """The inline suppressions of one Markdown document, and a violation for each invalid one."""
    lines = text.splitlines()
    found: list[Suppression] = []
    bad: list[dict[str, Any]] = []
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:  # an example in a code block is text
            continue
        spans = [c.span() for c in _CODE_SPAN.finditer(line)]
        for m in _COMMENT.finditer(line):
            if any(a <= m.start() < b for a, b in spans):
                continue
            code_m = _CODE.match(m.group("code") or "")
            reason = (m.group("reason") or "").strip()
            if code_m is None or len(reason) < 3:
                bad.append(invalid(file, i + 1, m.group(), "a claims code" if code_m is None else "a reason"))
                continue
            own_line = not _COMMENT.sub("", line).strip()
            if own_line:
                first = next((k for k in range(i + 1, len(lines)) if lines[k].strip()), i + 1)
                start = first + 1
            else:
                first = i
                while first > 0 and lines[first - 1].strip():
                    first -= 1
                start = first + 1
            found.append(
                Suppression(
                    file=file,
                    line=i + 1,
                    first=start,
                    last=_paragraph(lines, start),
                    code=code_m.group(1),
                    reason=reason,
                )
            )
    return found, bad


def invalid(file: str, line: int, text: str, missing: str) -> dict[str, Any]:
    """The violation for a suppression comment that lacks ``missing`` (a code or a reason)."""
    return {
        "code": "claims_suppression_invalid",
        "severity": "error",
        "message": f"a claims suppression needs {missing}: "
        "<!-- ckptgate: allow claims_CODE \u2014 why this sentence is right as written -->; it suppresses nothing",
        "evidence": {"text": text, "citations": []},
        "location": {"file": file, "line": line},
    }


def ignores(config_ignores: Iterable[tuple[str, Sequence[str], str]], files: Iterable[str]) -> list[Suppression]:
    """``claims_ignore`` entries as suppressions of every line of each file their glob matches."""
    out: list[Suppression] = []
    for path in files:
        for glob, codes, reason in config_ignores:
            if fnmatch.fnmatchcase(path, glob):
                out.extend(
                    Suppression(file=path, line=0, first=1, last=1 << 30, code=c, reason=reason, kind="external")
                    for c in codes
                )
    return out


def apply(violations: Sequence[dict[str, Any]], suppressions: Sequence[Suppression]) -> list[dict[str, Any]]:
    """Each violation, with ``suppression`` ({kind, justification, line}) when one covers it."""
    out = []
    for v in violations:
        s = next((s for s in suppressions if s.covers(v)), None)
        out.append(v if s is None else {**v, "suppression": {"kind": s.kind, "justification": s.reason}})
    return out
