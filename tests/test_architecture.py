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
BASE = ("errors", "interrupts", "group", "digestvalue", "_fs", "_json", "dtypes", "shapes", "_resources", "userfiles", "workdirs", "ckptgate")
#: The one-way pipeline, in order.
STEPS = ("inspect", "digest", "verify", "decide", "enforce", "consolidate", "publish")
#: Above the steps: they compose them and are imported by no step.
CONSUMERS = ("config", "policydata", "precedence", "gitbase", "widening", "pipeline", "grouped", "measure", "judge",
             "onepass", "outcome", "receipt",
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
COMPOSERS = ("pipeline.py", "grouped.py", "measure.py", "judge.py", "onepass.py", "outcome.py")  # the sequence
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


#: The modules of the one intake sequence (docs/architecture.md): only they run steps one after another.
SEQUENCE = ("pipeline.py", "grouped.py", "measure.py", "judge.py", "onepass.py", "outcome.py")
#: What runs a step of the intake (hash the shares, ask the policy, enforce, plan, write, stage, publish):
#: called from the step's own package and from the sequence, nowhere else (a second copy of a step).
STEP_ENTRIES = frozenset({"hash_files", "precheck", "decide", "enforce", "plan_for", "adapter_plan", "write_plan",
                          "share_of", "StreamedPlan", "staging", "open_stage", "publish"})
#: What the launch may do with bytes: authenticate its messages (HMAC-SHA256), and move them with torch.
LAUNCH_STEP_LOGIC = frozenset({"hashlib", "hmac", "torch", "torch.distributed"})


def step_calls(path: Path) -> list[str]:
    """The calls in ``path`` that run a step of the intake (:data:`STEP_ENTRIES`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in STEP_ENTRIES:
                found.append(f"{name}:{node.lineno}")
    return found


def outside_steps() -> Iterator[Path]:
    """Every module that is neither in a step's package nor one of the sequence's modules."""
    for path in sorted(SRC.rglob("*.py")):
        if unit(module_of(path)) not in STEPS and str(path.relative_to(SRC)) not in SEQUENCE:
            yield path


def test_every_step_runs_in_its_package_or_the_one_sequence() -> None:
    """No module outside a step's package and the sequence runs a step: a second copy of the
    pipeline (the launch's old phases, say) would have to."""
    assert {str(p.relative_to(SRC)): step_calls(p) for p in outside_steps() if step_calls(p)} == {}


def test_distributed_holds_no_step_logic() -> None:
    """distributed.py hashes only its messages' HMACs and moves them with torch: no other byte-level
    work, and no step (it runs grouped.py's sequence)."""
    path = SRC / "distributed.py"
    found = {f.split(":")[0].split(" ")[-1] for f in step_logic(path)}
    assert found <= LAUNCH_STEP_LOGIC and step_calls(path) == []


def step_definitions(path: Path) -> list[str]:
    """The functions and classes ``path`` defines under the name of a step's entry (:data:`STEP_ENTRIES`)."""
    return [f"{node.name}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in STEP_ENTRIES]


def test_every_step_is_implemented_in_its_package() -> None:
    """A step's entry (hash_files, enforce, write_plan, publish ...) is defined only in the step's
    package: one defined anywhere else, the sequence's modules and the launch included, is a second
    implementation of that step."""
    outside = (p for p in sorted(SRC.rglob("*.py")) if unit(module_of(p)) not in STEPS)
    assert {str(p.relative_to(SRC)): step_definitions(p) for p in outside if step_definitions(p)} == {}


def test_the_check_sees_a_step_outside_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a launch that enforces and writes a share itself is reported."""
    fake = tmp_path / "ckptgate"
    fake.mkdir()
    (fake / "distributed.py").write_text("import zlib\n\ndef phases(t, p):\n    enforce(t)\n    writer.write_plan(t, p)\n")
    (fake / "grouped.py").write_text("def f(t):\n    enforce(t)\n\n\ndef write_plan(t, p):\n    pass\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert step_definitions(fake / "grouped.py") == ["write_plan:5"]
    with pytest.raises(AssertionError):
        test_every_step_is_implemented_in_its_package()
    assert step_calls(fake / "distributed.py") == ["enforce:4", "write_plan:5"]
    with pytest.raises(AssertionError):
        test_every_step_runs_in_its_package_or_the_one_sequence()
    with pytest.raises(AssertionError):
        test_distributed_holds_no_step_logic()
    assert [p.name for p in outside_steps()] == ["distributed.py"]  # the sequence may run steps


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
