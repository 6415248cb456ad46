"""What users read in the documentation, for the claims lint (:mod:`ckptgate.evidence.claims`): the
sentences of ``README.md`` and ``docs/**/*.md`` with their ``[Rnn]`` citations, the notes of the
generated ``matrix/SUPPORT.md``, the register's reference ids, and the generated table rows, which
are checked against the matrix rows they were generated from rather than linted as prose."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.layout import RepoLayout

GENERATED_FILES = (Path("matrix") / "SUPPORT.md",)
REFERENCES = Path("docs") / "references.md"
MAX_DOC_BYTES = 4 << 20

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_CITE_GROUP = re.compile(r"\[(R\d{2}(?:\s*(?:[-\u2013,]\s*|,\s*)R\d{2})*)\]")
_ID = re.compile(r"R(\d{2})")
_RANGE = re.compile(r"R(\d{2})\s*[-\u2013]\s*R(\d{2})")
_REF_ROW = re.compile(r"^\s*(?:\|\s*|#+\s*|[-*]\s+\*{0,2})(R\d{2})\b")
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]*_]*\s+(?=[A-Z`\"'(\[*_0-9])")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")
_GEN_BEGIN = re.compile(r"<!--\s*ckptgate:generated\b")
_GEN_END = re.compile(r"<!--\s*/ckptgate:generated\s*-->")
_GEN_FILE = re.compile(r"generated file, do not edit")
ORIGINS = ("doc", "generated-notes", "cli", "docstring")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sentence:
    """One sentence of a document, where it starts, and the register ids it cites."""

    file: str
    line: int
    text: str
    citations: tuple[str, ...]
    origin: str = "doc"

    def __post_init__(self) -> None:
        if self.line < 1 or not self.text:
            raise ValueError("a sentence needs a line >= 1 and text")
        if self.origin not in ORIGINS:
            raise ValueError(f"unknown origin {self.origin!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "text": self.text,
            "citations": list(self.citations),
            "origin": self.origin,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratedRow:
    """One row of a generated matrix table: checked against the matrix data, not linted as prose."""

    file: str
    line: int
    text: str
    row: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text, "row": dict(self.row)}


def citations_in(text: str) -> tuple[str, ...]:
    """``[R27\u2013R29]`` -> R27, R28, R29; ``[R11, R12]`` -> R11, R12 (sorted, unique)."""
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
    header: list[str] | None = None
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
        had_comment = in_comment or "<!--" in line
        line, in_comment = _uncommented(line, in_comment)
        if had_comment and not line.strip():
            continue  # a line that only holds a comment neither is prose nor ends a paragraph
        stripped = line.strip()
        if stripped.startswith("|") and not _TABLE_RULE.match(stripped):
            if header is None:
                header = [c.strip() for c in re.split(r"(?<!\\)\|", stripped.strip("|"))]
            else:
                stripped = _table_text(stripped, header)
        elif not _TABLE_RULE.match(stripped):
            header = None
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


_CODE_SPAN = re.compile(r"(`+).*?\1")


def _uncommented(line: str, in_comment: bool) -> tuple[str, bool]:
    """The line without its HTML comments (``<!-- ... -->``, outside code spans), and whether a
    comment is still open at its end: the text around a comment is prose."""
    spans = [m.span() for m in _CODE_SPAN.finditer(line)]
    out: list[str] = []
    i = 0
    while i < len(line):
        if in_comment:
            end = line.find("-->", i)
            if end < 0:
                break
            i, in_comment = end + 3, False
            continue
        start = line.find("<!--", i)
        while start >= 0 and any(a <= start < b for a, b in spans):
            start = line.find("<!--", start + 1)
        if start < 0:
            out.append(line[i:])
            break
        out.append(line[i:start] + " ")
        i, in_comment = start + 4, True
    return "".join(out).rstrip(), in_comment


def _table_text(line: str, header: list[str] | None) -> str:
    """A table row; a cell under a negating column header ("does not", "limits") is read with it."""
    if header is None or not line.lstrip().startswith("|"):
        return line
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    if len(cells) != len(header):
        return line
    out = [
        f"{h} {c}" if _COLUMN_NEGATION.search(h) and c else _ANSWER_TEXT[_mark(c)] if _answers(h, c) else c
        for h, c in zip(header, cells, strict=True)
    ]
    return "| " + " | ".join(out) + " |"


_COLUMN_NEGATION = re.compile(r"\b(?:not|never|no|limits?|out of scope|cannot)\b", re.IGNORECASE)
#: A column that asks a capability question ("Supported", "Works with ckptgate"), answered per row.
_COLUMN_CAPABILITY = re.compile(
    r"\b(?:supported|support|works?|compatible|compatibility|loads?|reads?|consolidates?|converts?|handled|accepted|"
    r"status|available|availability|ready)\b",
    re.IGNORECASE,
)
#: A yes or no under a capability column, as the claim it makes ("| FSDP2 | \u2705 |" under "Works").
_ANSWER_TEXT = {"yes": "supported", "no": "not supported"}
_MARKS = {
    "\u2705": "yes",
    "\u2713": "yes",
    "\u2714": "yes",
    "\u2611": "yes",
    "y": "yes",
    "\u274c": "no",
    "\u2717": "no",
    "\u2718": "no",
    "n": "no",
    "-": "no",
    "\u2014": "no",
}


def _answers(header: str, cell: str) -> bool:
    """A yes/no mark ("yes", "no", a check or cross) under a capability column is read with the
    column: "| FSDP2 | yes |" under "Supported" says FSDP2 is supported."""
    return bool(_COLUMN_CAPABILITY.search(header)) and _mark(cell) in ("yes", "no")


def _mark(cell: str) -> str:
    """A cell as a yes or no where it is one; a mark's emoji presentation ("\u2714\ufe0f") is the mark."""
    text = cell.lower().replace("\ufe0f", "")
    return _MARKS.get(text, text)


_EMPHASIS = re.compile(r"(?<![\w`])(__?)(?=[^\s_])([^_`\n]+?)(?<=[^\s_])\1(?![\w`])")
_ALT = re.compile(r"<img\b[^>]*?\balt\s*=\s*(?:\"([^\"]*)\"|'([^']*)')[^>]*>", re.IGNORECASE)
_TAG = re.compile(r"</?[A-Za-z][\w-]*(?:\s[^<>]*)?/?>")


def _clean(text: str) -> str:
    text = re.sub(r"^(#+|[-*+]|\d+[.)])\s+", "", text)
    text = text.replace("**", "")  # inline code keeps its backticks: the claim model reads it as code
    text = _EMPHASIS.sub(r"\2", text)  # _ZeRO-1_, __FSDP2__
    text = _ALT.sub(lambda m: f" {m.group(1) or m.group(2) or ''} ", text)  # an image's alt text is read
    text = _TAG.sub(" ", text)  # other HTML tags (<b>, <br>, <summary>) are markup
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)  # links keep their words
    return re.sub(r"\s+", " ", text.strip(" |"))


def extract(text: str, *, file: str, origin: str = "doc") -> list[Sentence]:
    """Sentences of one Markdown document (fenced code and generated blocks skipped)."""
    out: list[Sentence] = []
    lines = text.splitlines()
    for n in _generated_lines(lines, whole_file=False):
        lines[n - 1] = ""
    for _, block in _blocks(lines):
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
                out.append(Sentence(file=file, line=line, text=cleaned, citations=citations_in(piece), origin=origin))
    return _answered(out)


def _answered(items: list[Sentence]) -> list[Sentence]:
    """A question and the sentence after it, its answer, read as one sentence: "ZeRO-1? Supported.",
    "Does ckptgate support FSDP2? Yes.", a FAQ heading and the first sentence below it."""
    out: list[Sentence] = []
    for s in items:
        q = out[-1] if out else None
        if q is not None and re.search(r"\?[\"')\]*_]*$", q.text):
            out[-1] = Sentence(
                file=q.file,
                line=q.line,
                text=f"{q.text} {s.text}",
                citations=tuple(sorted({*q.citations, *s.citations})),
                origin=q.origin,
            )
        else:
            out.append(s)
    return out


def _generated_lines(lines: Sequence[str], *, whole_file: bool) -> list[int]:
    """Line numbers inside generated blocks (markers included); every table line of a generated file."""
    out: list[int] = []
    inside = False
    for n, line in enumerate(lines, start=1):
        if _GEN_END.search(line):
            out.append(n)
            inside = False
        elif _GEN_BEGIN.search(line):
            out.append(n)
            inside = True
        elif inside or (whole_file and line.lstrip().startswith("|")):
            out.append(n)
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


_DIGEST_PREFIX = re.compile(r"sha256:[0-9a-f]+")


def _fixture_digest_prefix(cell: str) -> str:
    """The fixture digest (prefix) a matrix cell shows: ``name (sha256:abcd…)`` or ``sha256:abcd…``;
    the cell as written when it shows none, so that it matches no row."""
    m = _DIGEST_PREFIX.search(cell)
    return m.group(0) if m else cell.rstrip("\u2026.").strip()


def generated_rows(text: str, *, file: str) -> list[GeneratedRow]:
    """Matrix table rows (a header with ``status`` and ``adapter``) inside generated blocks."""
    lines = text.splitlines()
    whole = bool(lines) and bool(_GEN_FILE.search(lines[0]))
    out: list[GeneratedRow] = []
    header: list[str] | None = None
    for n in _generated_lines(lines, whole_file=whole):
        line = lines[n - 1]
        if not line.lstrip().startswith("|") or _TABLE_RULE.match(line.strip()):
            if not line.lstrip().startswith("|"):
                header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if "status" not in header or "adapter" not in header:
            continue
        got = dict(zip(header, cells, strict=False))
        adapter, _, version = got.get("adapter", "").partition(" ")
        row = {
            "status": got.get("status", ""),
            "adapter": adapter,
            "adapter_version": version.strip(),
            "format": [f.strip() for f in got.get("format", "").split(",") if f.strip()],
            "fixture": _fixture_digest_prefix(got.get("fixture", "")),
        }
        out.append(GeneratedRow(file=file, line=n, text=_clean(line), row=row))
    return out


def _generated_prose(text: str, *, file: str) -> list[Sentence]:
    """The notes of a generated file: every line that is not part of a table."""
    lines = text.splitlines()
    for n in _generated_lines(lines, whole_file=True):
        lines[n - 1] = ""
    return extract("\n".join(lines), file=file, origin="generated-notes")


def doc_files(repo: Path, docs: Sequence[Path] | None = None) -> list[Path]:
    """The documents linted: ``docs`` when given (a configuration's docs globs, matched), else
    ``README.md`` and ``docs/**/*.md``."""
    if docs is not None:
        return list(docs)
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


def generated_files(repo: Path | RepoLayout) -> list[Path]:
    """The generated ``SUPPORT.md`` in the layout's matrix directory, when it exists."""
    found = (
        [repo.matrix / p.name for p in GENERATED_FILES]
        if isinstance(repo, RepoLayout)
        else [repo / p for p in GENERATED_FILES]
    )
    return [p for p in found if p.is_file()]


def _root(repo: Path | RepoLayout) -> Path:
    return repo.root if isinstance(repo, RepoLayout) else repo


def generated(repo: Path | RepoLayout, docs: Sequence[Path] | None = None) -> list[GeneratedRow]:
    layout, repo = repo, _root(repo)
    out: list[GeneratedRow] = []
    for f in [*doc_files(repo, docs), *generated_files(layout)]:
        out.extend(generated_rows(_read(f), file=f.relative_to(repo).as_posix()))
    return out
