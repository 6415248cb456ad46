"""The claims lint: what users read, as sentences with their ``[Rnn]`` citations and claim facts,
judged by the ``ckptgate.claims`` Rego package against the register's claim rules 1-7.

What users read: ``README.md``, ``docs/**/*.md``, the notes of the generated ``matrix/SUPPORT.md``
and, in ckptgate's own source tree, the CLI help text (``help=`` and command docstrings in
``src/ckptgate/_cli``) and the docstrings of the public API (the modules ``ckptgate/__init__.py``
names).  Fenced code blocks and HTML comments are skipped (the text around a comment is read, and an
``<img>`` tag's alt text); inline code is kept as text.  Table rows
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
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from ckptgate._resources import policies_dir
from ckptgate.evidence import suppressions
from ckptgate.evidence.claimfacts import Vocabulary, sentence_facts
from ckptgate.evidence.claims_code import _SOURCE, _parse, api_docstrings, cli_help, public_modules
from ckptgate.evidence.claims_docs import (
    GeneratedRow,
    Sentence,
    _generated_prose,
    _read,
    _root,
    citations_in,
    doc_files,
    extract,
    generated,
    generated_files,
    generated_rows,
    reference_ids,
)
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.evidence.suppressions import Suppression

ENTRYPOINT = "ckptgate/claims/violations"
VOCABULARY = "ckptgate/claims/vocabulary"
GENERATED_FILES = (Path("matrix") / "SUPPORT.md",)
REFERENCES = Path("docs") / "references.md"
MAX_DOC_BYTES = 4 << 20

ORIGINS = ("doc", "generated-notes", "cli", "docstring")


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
