"""What users read in ckptgate's own source tree, for the claims lint (:mod:`ckptgate.evidence.claims`):
the CLI help text (``help=`` and command docstrings under ``src/ckptgate/_cli``) and the docstrings
of the public API (the modules ``ckptgate/__init__.py`` names), as sentences."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ckptgate.evidence.claims_docs import Sentence, _read, extract
from ckptgate.evidence.errors import EvidenceError

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
