"""The core dependency set: every distribution pyproject.toml declares for the core is imported by
ckptgate's own code (an unused one costs every user its whole closure: opa-python-client brought 9
distributions and 11 MB, aiohttp among them, that nothing imported), and the README states the size
this measures."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.test_package import closure_size

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "ckptgate"


def core_requirements() -> list[str]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def imported_top_levels() -> set[str]:
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_core_dependency_is_imported_by_ckptgate():
    provided: dict[str, set[str]] = {}
    for top, dists in md.packages_distributions().items():
        for dist in dists:
            provided.setdefault(canonicalize_name(dist), set()).add(top)
    imported = imported_top_levels()
    unused = []
    for req in core_requirements():
        name = canonicalize_name(Requirement(req).name)
        tops = provided.get(name)
        assert tops, f"{name} is not installed in the test environment"
        if not tops & imported:
            unused.append(name)
    assert not unused, f"core dependencies nothing in src/ckptgate imports: {unused}"


def test_the_readme_states_the_measured_core_size():
    sizes = closure_size(core_requirements())
    readme = (REPO / "README.md").read_text()
    stated = re.search(r"is (\d+) distributions and (\d+) MB installed", readme)
    assert stated, "README.md no longer states the core dependency set's size"
    assert int(stated.group(1)) == len(sizes), sorted(sizes)
    assert abs(int(stated.group(2)) - sum(sizes.values()) / 1e6) < 1.0
