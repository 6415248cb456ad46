"""The code's imports follow docs/architecture.md: steps in pipeline order, each importing only
steps before it and the modules below every step; the consumers above; no circle between units.

Every import counts, the ones inside functions too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "ckptgate"

#: Below every step: any step may import these, and they import only each other.
BASE = ("errors", "interrupts", "group", "_fs", "_json", "dtypes", "_resources", "userfiles", "workdirs", "ckptgate")
#: The one-way pipeline, in order.
STEPS = ("inspect", "digest", "verify", "decide", "enforce", "consolidate", "publish")
#: Above the steps: they compose them and are imported by no step.
CONSUMERS = ("config", "policydata", "precedence", "gitbase", "widening", "pipeline", "grouped", "receipt", "distributed", "evidence", "demo", "api", "_cli",
             "__main__")


def unit(module: str) -> str:
    """``ckptgate.inspect.formats.dcp`` -> ``inspect``; ``ckptgate`` itself -> ``ckptgate``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def rank(u: str) -> int:
    if u in BASE:
        return 0
    if u in STEPS:
        return 1 + STEPS.index(u)
    assert u in CONSUMERS, f"{u}: a unit docs/architecture.md does not place; add it to this test's layers"
    return 1 + len(STEPS)


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[str, int]]:
    """Every ckptgate module ``path`` imports, with its line, wherever the import statement is."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "ckptgate":
            if node.module == "ckptgate":  # `from ckptgate import x`: x may be a unit
                for a in node.names:
                    yield (f"ckptgate.{a.name}" if (SRC / a.name).exists() or (SRC / f"{a.name}.py").exists()
                           else "ckptgate"), node.lineno
            else:
                yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "ckptgate":
                    yield a.name, node.lineno


def edges() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        src = unit(module_of(path))
        for target, line in imports(path):
            dst = unit(target)
            if dst != src:
                out.setdefault((src, dst), []).append(f"{path.relative_to(SRC.parent)}:{line}")
    return out


def test_every_import_points_down_the_pipeline() -> None:
    upward = {f"{a} -> {b}": where for (a, b), where in edges().items() if rank(b) > rank(a)}
    assert upward == {}


def test_there_is_no_circle_between_units() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in edges():
        graph.setdefault(a, set()).add(b)
    seen: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles: list[list[str]] = []

    def visit(u: str, stack: list[str]) -> None:
        seen[u] = 1
        for v in sorted(graph.get(u, ())):
            if seen.get(v) == 1:
                cycles.append([*stack[stack.index(v):], v] if v in stack else [u, v])
            elif v not in seen:
                visit(v, [*stack, v])
        seen[u] = 2

    for u in sorted(graph):
        if u not in seen:
            visit(u, [u])
    assert cycles == []


def test_the_check_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: an inspect module that imports the pipeline is reported."""
    fake = tmp_path / "ckptgate"
    (fake / "inspect").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "inspect" / "__init__.py").write_text("def f():\n    from ckptgate.pipeline import intake\n")
    (fake / "pipeline.py").write_text("from ckptgate.inspect import f\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert ("inspect", "pipeline") in edges()
    with pytest.raises(AssertionError):
        test_every_import_points_down_the_pipeline()
    with pytest.raises(AssertionError):
        test_there_is_no_circle_between_units()
