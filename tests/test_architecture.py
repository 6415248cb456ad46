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
CONSUMERS = ("config", "policydata", "precedence", "gitbase", "widening", "pipeline", "grouped", "receipt",
             "distributed", "evidence", "demo", "api", "producer", "hooks", "_cli",
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


#: The modules that compose the steps: they call steps, and implement none.
COMPOSERS = ("pipeline.py", "grouped.py")
#: What only a step does with checkpoint bytes (hash, parse, copy): never in a composer.
STEP_ONLY_IMPORTS = frozenset({"hashlib", "hmac", "heapq", "zipfile", "pickle", "pickletools", "struct", "zlib",
                               "safetensors", "torch", "mmap"})
STEP_ONLY_CALLS = frozenset({"pread", "pwrite", "preadv", "pwritev", "sendfile", "copy_file_range", "write"})
#: What distributed.py (the launch: rendezvous, secret, signals, the torch group) may import of ckptgate.
LAUNCH_IMPORTS = frozenset({"ckptgate", "ckptgate.errors", "ckptgate.interrupts", "ckptgate.group",
                            "ckptgate.grouped", "ckptgate.pipeline", "ckptgate.decide.options"})
LAUNCH_MAX_LINES = 350


def step_logic(path: Path) -> list[str]:
    """What in ``path`` is a step's work: a byte-level import, or a raw read or write of a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}:{node.lineno}" for a in node.names if a.name.split(".")[0] in STEP_ONLY_IMPORTS]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in STEP_ONLY_IMPORTS:
            found.append(f"from {node.module}:{node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr in STEP_ONLY_CALLS and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(f"os.{node.attr}:{node.lineno}")
    return found


def test_the_composers_implement_no_step() -> None:
    """pipeline.py and grouped.py compose the steps: hashing, parsing and copying bytes live in a step's package."""
    assert {name: step_logic(SRC / name) for name in COMPOSERS if step_logic(SRC / name)} == {}


def test_distributed_is_the_launch_and_the_group_only() -> None:
    """distributed.py forms the torch group (rendezvous, secret, signals) and runs grouped.py's
    steps over it: it imports no step, and stays small."""
    path = SRC / "distributed.py"
    foreign = sorted({m for m, _ in imports(path)} - LAUNCH_IMPORTS)
    assert foreign == []
    assert len(path.read_text(encoding="utf-8").splitlines()) < LAUNCH_MAX_LINES


def test_the_check_sees_a_step_in_a_composer(tmp_path: Path) -> None:
    """The check can fail: a composer that hashes, or writes bytes itself, is reported."""
    bad = tmp_path / "pipeline.py"
    bad.write_text("import hashlib\nimport os\n\ndef f(fd):\n    os.pwrite(fd, b'x', 0)\n")
    assert step_logic(bad) == ["import hashlib:1", "os.pwrite:5"]


def module_cycles(package: str) -> list[list[str]]:
    """The circles between the modules of ``package`` (a package's ``__init__`` counts as a module)."""
    mods = {module_of(p) for p in (SRC / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in (SRC / package).rglob("*.py"):
        for target, _ in imports(path):
            if target in mods and target != module_of(path):
                graph.setdefault(module_of(path), set()).add(target)
    cycles: list[list[str]] = []

    def visit(u: str, stack: list[str]) -> None:
        for v in sorted(graph.get(u, ())):
            if v in stack:
                cycles.append([*stack[stack.index(v):], v])
            elif len(stack) < len(mods):
                visit(v, [*stack, v])

    for u in sorted(graph):
        visit(u, [u])
    return cycles


def test_the_cli_modules_import_in_no_circle() -> None:
    """``_base`` (the group, the handlers) imports no command; ``_main`` imports the commands after
    the handlers are in; no command module imports ``_main``."""
    assert module_cycles("_cli") == []
