"""The claims lint: what users read, as sentences with their ``[Rnn]`` citations and claim facts,
judged by the ``ckptgate.claims`` Rego package against the register's claim rules 1-7.

What users read: ``README.md``, ``docs/**/*.md``, the notes of the generated ``matrix/SUPPORT.md``
and, in ckptgate's own source tree, the CLI help text (``help=`` and command docstrings in
``src/ckptgate/_cli``) and the docstrings of the public API (the modules ``ckptgate/__init__.py``
names).  Fenced code blocks and HTML comments are skipped; inline code is kept as text.  Table rows
between generated-block markers (``<!-- ckptgate:generated ... -->`` ... ``<!-- /ckptgate:generated -->``,
or a whole file whose first line says ``generated file, do not edit``) are not linted as prose:
they are checked against the matrix rows they were generated from.

Python only extracts (the claim model is :mod:`ckptgate.evidence.claimfacts`, its vocabulary the
policy data ``data.ckptgate.config.claims``, read from the engine); Rego decides.  Input document::

    {"sentences": [{"file", "line", "text", "origin", "citations": ["R01", ...], "facts": {...}}],
     "references": ["R01", ...],          # ids defined in docs/references.md
     "matrix": [row, ...],                # the rows of this repository's support matrix
     "matrix_source": {"name", "path"},   # whose matrix that is (path None: the repository has none)
     "generated": [{"file", "line", "text", "row": {...}}]}   # generated table rows
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from ckptgate._resources import policies_dir
from ckptgate.evidence import suppressions
from ckptgate.evidence.claimfacts import Vocabulary, sentence_facts
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.evidence.suppressions import Suppression

ENTRYPOINT = "ckptgate/claims/violations"
VOCABULARY = "ckptgate/claims/vocabulary"
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
        if in_comment or "<!--" in line:
            in_comment = "-->" not in line.split("<!--")[-1] if "<!--" in line else "-->" not in line
            continue
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


def _table_text(line: str, header: list[str] | None) -> str:
    """A table row; a cell under a negating column header ("does not", "limits") is read with it."""
    if header is None or not line.lstrip().startswith("|"):
        return line
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    if len(cells) != len(header):
        return line
    out = [f"{h} {c}" if _COLUMN_NEGATION.search(h) and c else c for h, c in zip(header, cells, strict=True)]
    return "| " + " | ".join(out) + " |"


_COLUMN_NEGATION = re.compile(r"\b(?:not|never|no|limits?|out of scope|cannot)\b", re.IGNORECASE)


def _clean(text: str) -> str:
    text = re.sub(r"^(#+|[-*+]|\d+[.)])\s+", "", text)
    text = text.replace("**", "")  # inline code keeps its backticks: the claim model reads it as code
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


def sentences(repo: Path | RepoLayout, docs: Sequence[Path] | None = None) -> list[Sentence]:
    """Every sentence users read: docs, generated notes, CLI help and public docstrings."""
    layout, repo = repo, _root(repo)
    out: list[Sentence] = []
    for f in doc_files(repo, docs):
        out.extend(extract(_read(f), file=f.relative_to(repo).as_posix()))
    for f in generated_files(layout):
        out.extend(_generated_prose(_read(f), file=f.relative_to(repo).as_posix()))
    out.extend(cli_help(repo))
    out.extend(api_docstrings(repo))
    return out


def generated(repo: Path | RepoLayout, docs: Sequence[Path] | None = None) -> list[GeneratedRow]:
    layout, repo = repo, _root(repo)
    out: list[GeneratedRow] = []
    for f in [*doc_files(repo, docs), *generated_files(layout)]:
        out.extend(generated_rows(_read(f), file=f.relative_to(repo).as_posix()))
    return out


# ----------------------------------------------------------------------------- source text
_SOURCE = Path("src") / "ckptgate"
_CLICK_CALLS = {"option", "argument", "command", "group", "Option", "Argument"}


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(_read(path), filename=str(path))
    except SyntaxError:
        raise EvidenceError("evidence.claims.syntax", f"{path} does not parse as Python") from None


def _rst_to_text(doc: str) -> str:
    """A docstring as Markdown-ish text: literal blocks after ``::`` fenced, roles reduced to their text."""
    out: list[str] = []
    literal_indent: int | None = None
    pending = False
    for line in doc.splitlines():
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if line.strip() and indent <= literal_indent:
                out.append("```")
                literal_indent = None
            else:
                out.append(line)
                continue
        if pending and line.strip():
            out.append("```")
            literal_indent = indent - 1
            pending = False
            out.append(line)
            continue
        text = re.sub(r":\w+:`~?([^`]+)`", r"\1", line)
        out.append(text)
        if line.rstrip().endswith("::"):
            pending = True
            out[-1] = text.rstrip()[:-1]
    if literal_indent is not None:
        out.append("```")
    return "\n".join(out)


def _docstring_sentences(node: ast.AST, rel: str, origin: str) -> list[Sentence]:
    doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
    if not doc:
        return []
    body = getattr(node, "body", None)
    first = body[0].lineno if body else getattr(node, "lineno", 1)
    return [
        Sentence(file=rel, line=first + s.line - 1, text=s.text, citations=s.citations, origin=origin)
        for s in extract(_rst_to_text(doc), file=rel, origin=origin)
    ]


def cli_help(repo: Path) -> list[Sentence]:
    """Help text of the click commands in ``src/ckptgate/_cli``: ``help=`` strings and command docstrings."""
    base = repo / _SOURCE / "_cli"
    if not base.is_dir():
        return []
    out: list[Sentence] = []
    for path in sorted(base.glob("*.py")):
        tree = _parse(path)
        rel = path.relative_to(repo).as_posix()
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call) and _call_name(node) in _CLICK_CALLS:
                for kw in node.keywords:
                    if (
                        kw.arg in ("help", "short_help")
                        and isinstance(kw.value, ast.Constant)
                        and isinstance(kw.value.value, str)
                    ):
                        out.extend(
                            Sentence(
                                file=rel,
                                line=kw.value.lineno + s.line - 1,
                                text=s.text,
                                citations=s.citations,
                                origin="cli",
                            )
                            for s in extract(kw.value.value, file=rel, origin="cli")
                        )
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and _call_name(d) in ("command", "group") for d in node.decorator_list
            ):
                out.extend(_docstring_sentences(node, rel, "cli"))
    return out


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def public_modules(repo: Path) -> list[Path]:
    """The package's ``__init__.py`` and every source file of the modules it names with ``:mod:``."""
    init = repo / _SOURCE / "__init__.py"
    if not init.is_file():
        return []
    names = sorted(set(re.findall(r":mod:`ckptgate\.([a-z][\w]*)`", _read(init))))
    files = [init]
    for name in names:
        pkg, mod = repo / _SOURCE / name, repo / _SOURCE / f"{name}.py"
        if pkg.is_dir():
            files.extend(
                p
                for p in sorted(pkg.rglob("*.py"))
                if not any(part.startswith("_") and part != "__init__.py" for part in p.relative_to(pkg).parts)
            )
        elif mod.is_file():
            files.append(mod)
    return files


def _exported(tree: ast.Module) -> set[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return {str(x) for x in ast.literal_eval(node.value)}
            except ValueError:
                return None
    return None


def api_docstrings(repo: Path) -> list[Sentence]:
    """Docstrings of the public API: each public module, and the classes and functions it exports."""
    out: list[Sentence] = []
    for path in public_modules(repo):
        tree = _parse(path)
        if tree is None:
            continue
        rel = path.relative_to(repo).as_posix()
        out.extend(_docstring_sentences(tree, rel, "docstring"))
        exported = _exported(tree)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                node.name in exported if exported is not None else not node.name.startswith("_")
            ):
                out.extend(_docstring_sentences(node, rel, "docstring"))
                if isinstance(node, ast.ClassDef):
                    for sub in node.body:
                        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                            out.extend(_docstring_sentences(sub, rel, "docstring"))
    return out


def with_facts(items: Iterable[Sentence], vocabulary: Vocabulary) -> list[dict[str, Any]]:
    """Each sentence as JSON with its claim facts."""
    return [{**s.to_json(), "facts": sentence_facts(vocabulary, s.text)} for s in items]


def claims_input(
    repo: Path | RepoLayout,
    matrix_rows: Sequence[dict[str, Any]] | None = None,
    *,
    vocabulary: Vocabulary | None = None,
    docs: Sequence[Path] | None = None,
) -> dict[str, Any]:
    """The input document for ``data.ckptgate.claims.violations``: this repository's text and matrix."""
    if matrix_rows is None:
        matrix_rows = committed_rows(repo)
    if vocabulary is None:
        vocabulary = local_vocabulary(_root(repo))
    vocabulary = with_identifiers(vocabulary, source_identifiers(_root(repo)))
    return {
        "sentences": with_facts(sentences(repo, docs), vocabulary),
        "references": reference_ids(_root(repo)),
        "matrix": list(matrix_rows),
        "matrix_source": matrix_source(repo, matrix_rows),
        "generated": [g.to_json() for g in generated(repo, docs)],
    }


_DEFINED = re.compile(r"^\s*(?:class|def)\s+([A-Za-z_]\w*)", re.MULTILINE)
#: A constant the code defines (``MAX_BYTES = ...``) or reads from a module (``signal.SIGINT``,
#: ``errno.EINTR``): an identifier of an API, such as an OS signal or error name.
_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]+)\s*(?::[^=\n]*)?=|\b[a-z_]\w*\.([A-Z][A-Z0-9_]+)\b", re.MULTILINE)


def source_identifiers(repo: Path) -> frozenset[str]:
    """Class and function names defined in the repository's ``src/**/*.py``, and the constants it
    defines or reads from a module (``signal.SIGINT``): identifiers, not product names, when
    documentation names them without code markup."""
    src = repo / "src"
    if not src.is_dir():
        return frozenset()
    names: set[str] = set()
    for p in src.rglob("*.py"):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        names.update(_DEFINED.findall(text))
        names.update(a or b for a, b in _CONSTANT.findall(text))
    return frozenset(n for n in names if not n.startswith("_"))


def with_identifiers(vocabulary: Vocabulary, names: frozenset[str]) -> Vocabulary:
    """The vocabulary with ``names`` added to its non-systems (never to its systems)."""
    if not names:
        return vocabulary
    data = dict(vocabulary.data)
    data["non_systems"] = [*(data.get("non_systems") or []), *sorted(names)]
    return Vocabulary(data)


def matrix_source(repo: Path | RepoLayout, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whose support matrix the claims are judged against: the repository's name and its matrix's
    path (``None`` when it has none), for the messages."""
    layout = as_layout(repo)
    path = layout.matrix / "support.json"
    has = bool(rows) or path.is_file()
    return {"name": layout.root.name, "path": layout.rel(path) if has else None}


def local_vocabulary(repo: Path) -> Vocabulary:
    """The claims vocabulary from ``REPO/policies`` (or the package's own), for use without an engine."""
    for base in (repo / "policies", policies_dir()):
        p = base / "ckptgate" / "config" / "claims" / "data.json" if base is not None else None
        if p is not None and p.is_file():
            return _vocabulary_from(json.loads(_read(p)))
    raise EvidenceError("evidence.claims.no_vocabulary", "no policies/ckptgate/config/claims/data.json found")


def _vocabulary_from(doc: Any) -> Vocabulary:
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("systems"), dict)
        or not isinstance(doc.get("lexicon"), dict)
    ):
        raise EvidenceError(
            "evidence.claims.bad_vocabulary", "data.ckptgate.config.claims has no systems or lexicon object"
        )
    try:
        vocab = Vocabulary(doc)
        sentence_facts(vocab, "ckptgate supports safetensors.")  # compiles every pattern once
    except (re.error, KeyError, TypeError, AttributeError) as e:
        raise EvidenceError("evidence.claims.bad_vocabulary", f"the claims vocabulary is invalid: {e}") from None
    return vocab


def engine_vocabulary(engine: Any) -> Vocabulary:
    """The vocabulary the policy itself sees (``data.ckptgate.claims.vocabulary``)."""
    return _vocabulary_from(engine.evaluate(VOCABULARY, {}).result)


def committed_rows(repo: Path | RepoLayout) -> list[dict[str, Any]]:
    """The rows of the committed ``support.json`` in the layout's matrix directory ([] without one)."""
    layout = as_layout(repo)
    p = layout.matrix / "support.json"
    if not p.is_file():
        return []
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise EvidenceError("evidence.claims.matrix_json", f"{layout.rel(p)} is not JSON: {e}") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def doc_suppressions(
    repo: Path | RepoLayout,
    docs: Sequence[Path] | None = None,
    ignore: Sequence[tuple[str, Sequence[str], str]] = (),
) -> tuple[list[Suppression], list[dict[str, Any]]]:
    """The inline suppressions in the linted documents and the ``claims_ignore`` entries that match
    them, and a violation for each invalid inline one."""
    repo = _root(repo)
    found: list[Suppression] = []
    bad: list[dict[str, Any]] = []
    rels = []
    for f in doc_files(repo, docs):
        rel = f.relative_to(repo).as_posix()
        rels.append(rel)
        text = _read(f)
        if "ckptgate:" in text:
            got, wrong = suppressions.inline(text, file=rel)
            found += got
            bad += wrong
    return found + suppressions.ignores(ignore, rels), bad


#: Where the test command records its last pytest run (JUnit XML), for :func:`capability_violations`;
#: ``scripts/bootstrap.py`` writes it (a test keeps the two names equal).
LAST_TEST_RUN = ".ckptgate-last-test-run.xml"


def capability_violations(
    repo: Path | RepoLayout, vocabulary: Vocabulary, *, last_run: Path | None = None
) -> list[dict[str, Any]]:
    """In ckptgate's own source tree: each listed capability's test (``path::function``) must exist, its
    docstring must name the capability, and the last test run (``last_run``, default the test command's
    record :data:`LAST_TEST_RUN`) must have collected and passed it (``claims_capability_untested``
    otherwise).  Without a record of the last run that is a warning: nothing says it ran."""
    repo = _root(repo)
    if not (repo / _SOURCE).is_dir() or not (repo / "tests").is_dir():
        return []  # a consumer repository: the capability list was checked where ckptgate is built
    record = last_run if last_run is not None else repo / LAST_TEST_RUN
    ran = _passed_tests(record)
    out = []
    for cap in vocabulary.data.get("capabilities") or []:
        path, _, name = str(cap.get("test", "")).partition("::")
        why = _untested(repo / path, name, str(cap.get("name", ""))) if path and name else "it names no test"
        if not why and ran is not None and (path.removesuffix(".py").replace("/", "."), name) not in ran:
            why = f"{cap.get('test')} was not collected, or did not pass, in the last test run ({record.name})"
        if why:
            out.append(_capability_finding(cap, f"is not shown by a test: {why}", "error"))
    if ran is None and out == [] and vocabulary.data.get("capabilities"):
        out.append(
            _capability_finding(
                {"name": "every listed capability", "test": str(record)},
                f"cannot be confirmed: there is no record of the last test run ({record.name}); run the test "
                "command (python3 scripts/bootstrap.py test), which records it",
                "warning",
            )
        )
    return out


def _capability_finding(cap: dict[str, Any], what: str, severity: str) -> dict[str, Any]:
    return {
        "code": "claims_capability_untested",
        "severity": severity,
        "message": f"the capability {cap.get('name')!r} in the claims data {what}",
        "evidence": {"text": str(cap.get("test")), "citations": []},
        "location": {"file": "policies/ckptgate/config/claims/data.json", "line": 1},
    }


def _passed_tests(record: Path) -> set[tuple[str, str]] | None:
    """``(module, function)`` of every test case the JUnit record shows passed (parameters dropped);
    ``None`` when there is no readable record."""
    try:
        root = ElementTree.fromstring(record.read_bytes())
    except (OSError, ElementTree.ParseError):
        return None
    passed = set()
    for case in root.iter("testcase"):
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            continue
        passed.add((case.get("classname", ""), case.get("name", "").split("[", 1)[0]))
    return passed


def _untested(path: Path, name: str, capability: str) -> str:
    if not path.is_file():
        return f"{path.name} does not exist"
    tree = _parse(path)
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name] if tree else []
    fn = fns[0] if fns else None
    if fn is None:
        return f"{path.name} defines no {name}"
    if capability.lower() not in (ast.get_docstring(fn) or "").lower():
        return f"the docstring of {name} does not name {capability!r}"
    return ""


def lint(
    engine: Any,
    repo: Path | RepoLayout,
    matrix_rows: Sequence[dict[str, Any]] | None = None,
    *,
    docs: Sequence[Path] | None = None,
    ignore: Sequence[tuple[str, Sequence[str], str]] = (),
) -> list[dict[str, Any]]:
    """Violations (``{code, message, evidence, location}``, and ``suppression`` where an inline comment
    or a ``claims_ignore`` entry covers one) from the ``ckptgate.claims`` policy, sorted."""
    vocabulary = engine_vocabulary(engine)
    raw = engine.evaluate(ENTRYPOINT, claims_input(repo, matrix_rows, vocabulary=vocabulary, docs=docs))
    result = raw.result
    if not isinstance(result, list) or not all(isinstance(v, dict) for v in result):
        raise EvidenceError(
            "evidence.claims.bad_result",
            "data.ckptgate.claims.violations is not a list of objects",
            evidence={"type": type(result).__name__},
        )
    found, bad = doc_suppressions(repo, docs, ignore)
    result = suppressions.apply([*result, *bad, *capability_violations(repo, vocabulary)], found)
    return sorted(
        result,
        key=lambda v: (
            str((v.get("location") or {}).get("file")),
            int((v.get("location") or {}).get("line") or 0),
            str(v.get("code")),
        ),
    )


__all__ = [
    "ENTRYPOINT",
    "VOCABULARY",
    "GeneratedRow",
    "Sentence",
    "api_docstrings",
    "capability_violations",
    "citations_in",
    "claims_input",
    "cli_help",
    "committed_rows",
    "doc_files",
    "doc_suppressions",
    "engine_vocabulary",
    "extract",
    "generated",
    "generated_rows",
    "lint",
    "local_vocabulary",
    "matrix_source",
    "public_modules",
    "reference_ids",
    "sentences",
    "source_identifiers",
    "with_facts",
    "with_identifiers",
]
