"""The claims lint: sentences and ``[Rnn]`` citations extracted from ``docs/**/*.md`` and ``README.md``,
judged by the ``ckptgate.claims`` Rego package against the register's claim rules 1-7.

Python only extracts (fenced code blocks and HTML comments are skipped; inline code is kept as
text); Rego decides.  Input document::

    {"sentences": [{"file", "line", "text", "citations": ["R01", ...]}],
     "references": ["R01", ...],          # ids defined in docs/references.md
     "matrix": [row, ...]}                # rows of matrix/support.json
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate.evidence.errors import EvidenceError

ENTRYPOINT = "ckptgate/claims/violations"
REFERENCES = Path("docs") / "references.md"
MAX_DOC_BYTES = 4 << 20

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_CITE_GROUP = re.compile(r"\[(R\d{2}(?:\s*(?:[-\u2013,]\s*|,\s*)R\d{2})*)\]")
_ID = re.compile(r"R(\d{2})")
_RANGE = re.compile(r"R(\d{2})\s*[-\u2013]\s*R(\d{2})")
_REF_ROW = re.compile(r"^\s*(?:\|\s*|#+\s*|[-*]\s+\*{0,2})(R\d{2})\b")
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]*_]*\s+(?=[A-Z`\"'(\[*_0-9])")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sentence:
    """One sentence of a document, where it starts, and the register ids it cites."""

    file: str
    line: int
    text: str
    citations: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.line < 1 or not self.text:
            raise ValueError("a sentence needs a line >= 1 and text")

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text, "citations": list(self.citations)}


def citations_in(text: str) -> tuple[str, ...]:
    """``[R27–R29]`` -> R27, R28, R29; ``[R11, R12]`` -> R11, R12 (sorted, unique)."""
    ids: set[str] = set()
    for group in _CITE_GROUP.findall(text):
        for a, b in _RANGE.findall(group):
            lo, hi = sorted((int(a), int(b)))
            ids.update(f"R{n:02d}" for n in range(lo, hi + 1))
        ids.update(f"R{n}" for n in _ID.findall(_RANGE.sub("", group)))
    return tuple(sorted(ids))


def _blocks(lines: Sequence[str]) -> Iterable[tuple[int, list[tuple[int, str]]]]:
    """Paragraph-like blocks outside code fences and HTML comments: (first line, [(line, text)])."""
    in_fence, in_comment = False, False
    block: list[tuple[int, str]] = []
    for n, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if _FENCE.match(line):
            in_fence = not in_fence
            if block:
                yield block[0][0], block
                block = []
            continue
        if in_fence:
            continue
        if in_comment or "<!--" in line:
            in_comment = "-->" not in line.split("<!--")[-1] if "<!--" in line else "-->" not in line
            continue
        stripped = line.strip()
        is_item = bool(re.match(r"^(#+\s|[-*+]\s|\d+[.)]\s|\|)", stripped))
        if not stripped or is_item or _TABLE_RULE.match(stripped):
            if block:
                yield block[0][0], block
                block = []
            if stripped and not _TABLE_RULE.match(stripped):
                block = [(n, stripped)]
            continue
        block.append((n, stripped))
    if block:
        yield block[0][0], block


def _clean(text: str) -> str:
    text = re.sub(r"^(#+|[-*+]|\d+[.)])\s+", "", text)
    text = text.replace("`", "").replace("**", "")
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)  # links keep their words
    return re.sub(r"\s+", " ", text.strip(" |"))


def extract(text: str, *, file: str) -> list[Sentence]:
    """Sentences of one Markdown document (fenced code skipped)."""
    out: list[Sentence] = []
    for _, block in _blocks(text.splitlines()):
        joined, starts = "", []
        for n, part in block:
            starts.append((len(joined), n))
            joined += part + " "
        pos = 0
        for piece in _SPLIT.split(joined):
            at = joined.find(piece, pos)
            pos = at + len(piece)
            line = max(n for off, n in starts if off <= max(at, 0))
            cleaned = _clean(piece)
            if re.search(r"[A-Za-z]", cleaned):
                out.append(Sentence(file=file, line=line, text=cleaned, citations=citations_in(piece)))
    return out


def doc_files(repo: Path) -> list[Path]:
    files = sorted((repo / "docs").rglob("*.md")) if (repo / "docs").is_dir() else []
    if (repo / "README.md").is_file():
        files.insert(0, repo / "README.md")
    return files


def _read(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise EvidenceError("evidence.claims.unreadable", f"cannot read {path}: {e.strerror}") from None
    if len(raw) > MAX_DOC_BYTES:
        raise EvidenceError("evidence.claims.too_large", f"{path} is over {MAX_DOC_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EvidenceError("evidence.claims.not_utf8", f"{path} is not UTF-8") from None


def reference_ids(repo: Path) -> list[str]:
    """Register ids defined in ``docs/references.md`` (a table row, heading or list item starting with Rnn)."""
    path = repo / REFERENCES
    if not path.is_file():
        return []
    return sorted({m.group(1) for line in _read(path).splitlines() if (m := _REF_ROW.match(line))})


def sentences(repo: Path) -> list[Sentence]:
    out: list[Sentence] = []
    for f in doc_files(repo):
        out.extend(extract(_read(f), file=f.relative_to(repo).as_posix()))
    return out


def claims_input(repo: Path, matrix_rows: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The input document for ``data.ckptgate.claims.violations``."""
    if matrix_rows is None:
        matrix_rows = committed_rows(repo)
    return {"sentences": [s.to_json() for s in sentences(repo)], "references": reference_ids(repo),
            "matrix": list(matrix_rows)}


def committed_rows(repo: Path) -> list[dict[str, Any]]:
    p = repo / "matrix" / "support.json"
    if not p.is_file():
        return []
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise EvidenceError("evidence.claims.matrix_json", f"matrix/support.json is not JSON: {e}") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def lint(engine: Any, repo: Path, matrix_rows: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Violations (``{code, message, evidence, location}``) from the ``ckptgate.claims`` policy, sorted."""
    raw = engine.evaluate(ENTRYPOINT, claims_input(repo, matrix_rows))
    result = raw.result
    if not isinstance(result, list) or not all(isinstance(v, dict) for v in result):
        raise EvidenceError("evidence.claims.bad_result", "data.ckptgate.claims.violations is not a list of objects",
                            evidence={"type": type(result).__name__})
    return sorted(result, key=lambda v: (str((v.get("location") or {}).get("file")),
                                         int((v.get("location") or {}).get("line") or 0), str(v.get("code"))))


__all__ = ["ENTRYPOINT", "Sentence", "citations_in", "claims_input", "committed_rows", "doc_files", "extract",
           "lint", "reference_ids", "sentences"]
