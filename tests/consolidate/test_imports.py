"""Consolidate comes after enforce: it reads what enforce loaded (the record module
``ckptgate.enforce.load``), and never imports the rest of enforce (permit, containment, worker:
it starts no process and mints nothing), nor the pipeline that composes the steps."""

from __future__ import annotations

import ast
from pathlib import Path

import ckptgate.consolidate

PACKAGE = Path(ckptgate.consolidate.__file__).resolve().parent
ALLOWED_FROM_ENFORCE = {"ckptgate.enforce.load"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (functions and TYPE_CHECKING blocks included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"  # keep every import checkable by name
            names.add(node.module or "")
            names.update(f"{node.module}.{a.name}" for a in node.names)  # `from ckptgate import enforce`
    return names


def _forbidden(name: str) -> bool:
    if name in ALLOWED_FROM_ENFORCE or any(name.startswith(a + ".") for a in ALLOWED_FROM_ENFORCE):
        return False
    return any(name == m or name.startswith(m + ".") for m in ("ckptgate.enforce", "ckptgate.pipeline"))


def test_consolidate_imports_only_the_record_module_of_enforce_and_never_the_pipeline():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 5 and PACKAGE / "__init__.py" in modules
    bad = {str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if _forbidden(n)) for p in modules}
    assert {k: v for k, v in bad.items() if v} == {}
    assert any("ckptgate.enforce.load" in _imports(p) for p in modules)  # the record it does read


def test_the_check_sees_an_import_added_back(tmp_path):
    for src in ("from ckptgate.enforce.permit import issue_permit\n", "import ckptgate.enforce.worker\n",
                "def f():\n    from ckptgate.pipeline import evaluate\n", "from ckptgate.enforce import containment\n"):
        (tmp_path / "m.py").write_text(src)
        assert any(_forbidden(n) for n in _imports(tmp_path / "m.py")), src
