"""Every refusal's advice is the next step of this run (#33): it names a file, an option, a command
or a value of the run.  Generic advice ("Run the command with --help") names none of them.

Two walks:
* every place src/ckptgate builds an error (a call of :class:`ckptgate.errors.Error` or a subclass
  with a literal code): its ``advice=``, or else its class's ``default_advice``, must be specific;
* every deny reason code the policies can give (``_reason("...")`` in the Rego): the refusal
  that reason leads has advice of its own (:data:`ckptgate.enforce.advice.REASON_ADVICE`), and it
  is specific.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "ckptgate"

#: What specific advice names: a command in backquotes, an option, an environment variable, a file
#: (a path, or a name with an extension), or a value of this run (an f-string's field).
SPECIFIC = re.compile(
    r"`[^`]+`"  # a command or a file, quoted as code
    r"|(?<![\w-])--[a-z][a-z0-9-]+"  # an option
    r"|\b(?:CKPTGATE|XDG)_[A-Z_]+"  # an environment variable
    r"|\bpip install \S+"  # a command that installs what is missing
    r"|\bsha256:"  # the form of a value
    r"|\b[\w.-]+/[\w./-]+"  # a path
    r"|\b[\w-]+\.(?:json|pem|toml|py|rego|md|yaml|html|sarif|safetensors)\b"  # a file name
)
#: Advice that reads the same for every run, whatever it names.
GENERIC = ("Run the command with --help",)


@dataclass(frozen=True)
class Site:
    path: Path
    line: int
    cls: str
    code: str
    advice: ast.expr | None

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line} {self.cls}({self.code!r})"


def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(SRC.rglob("*.py"))}


def _error_classes(modules: dict[Path, ast.Module]) -> tuple[dict[str, str | None], dict[str, ast.expr]]:
    """Each error class's parent (``Error``: None) and, where it sets one, its ``default_advice``."""
    parents: dict[str, str | None] = {"Error": None}
    defaults: dict[str, ast.expr] = {}
    classes = [n for m in modules.values() for n in ast.walk(m) if isinstance(n, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for c in classes:
            for b in c.bases:
                name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                if name in parents and c.name not in parents:
                    parents[c.name] = name
                    changed = True
    for c in classes:
        if c.name in parents:
            for stmt in c.body:
                target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                    stmt.targets[0] if isinstance(stmt, ast.Assign) else None)
                if isinstance(target, ast.Name) and target.id == "default_advice" and stmt.value is not None:
                    defaults[c.name] = stmt.value
    return parents, defaults


def _constants(module: ast.Module) -> dict[str, ast.expr]:
    found: dict[str, ast.expr] = {}
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            found[stmt.targets[0].id] = stmt.value
    return found


def specific(expr: ast.expr, constants: dict[str, ast.expr], fallback: ast.expr | None = None) -> bool:
    """Whether advice built by ``expr`` names something of this run (``None``: the class default,
    ``fallback``)."""
    if isinstance(expr, ast.Constant) and expr.value is None:
        return fallback is not None and specific(fallback, constants)
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return bool(SPECIFIC.search(expr.value)) and not any(g in expr.value for g in GENERIC)
    if isinstance(expr, ast.JoinedStr):  # an f-string: a field is a value of this run
        text = "".join(v.value for v in expr.values if isinstance(v, ast.Constant))
        if any(g in text for g in GENERIC):
            return False
        return any(isinstance(v, ast.FormattedValue) for v in expr.values) or bool(SPECIFIC.search(text))
    if isinstance(expr, ast.IfExp):
        return specific(expr.body, constants, fallback) and specific(expr.orelse, constants, fallback)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return specific(expr.left, constants) or specific(expr.right, constants)
    if isinstance(expr, ast.Tuple | ast.List):  # implicit concatenation inside parentheses is one Constant
        return any(specific(e, constants) for e in expr.elts)
    if isinstance(expr, ast.Name):  # a module constant is judged; a parameter comes from a call site's values
        return specific(constants[expr.id], constants) if expr.id in constants else True
    if isinstance(expr, ast.Call):  # advice computed from this run's values, or another error's advice passed on
        return bool(expr.args or expr.keywords) or (
            isinstance(expr.func, ast.Attribute) and expr.func.attr == "diagnostics")
    return False


def sites() -> tuple[list[Site], dict[str, str | None], dict[str, ast.expr], dict[Path, ast.Module]]:
    modules = _modules()
    parents, defaults = _error_classes(modules)
    found: list[Site] = []
    for path, module in modules.items():
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else (
                node.func.attr if isinstance(node.func, ast.Attribute) else None)
            if name not in parents or not node.args:
                continue
            code = node.args[0]
            if not (isinstance(code, ast.Constant) and isinstance(code.value, str) and "." in code.value):
                continue  # not a literal error code (a re-raise of another error's code, say)
            advice = next((k.value for k in node.keywords if k.arg == "advice"), None)
            found.append(Site(path, node.lineno, name, code.value, advice))
    return found, parents, defaults, modules


def default_of(cls: str, parents: dict[str, str | None], defaults: dict[str, ast.expr]) -> ast.expr:
    c: str | None = cls
    while c is not None and c not in defaults:
        c = parents[c]
    assert c is not None, f"{cls} has no default_advice anywhere up to Error"
    return defaults[c]


def test_the_walk_finds_the_error_sites():
    found, parents, _, _ = sites()
    assert len(found) > 300 and {"UsageError", "InputRejected", "VerificationError", "RuntimeFailure"} <= set(parents)
    assert any(s.code == "usage.dst_exists" for s in found)


def test_generic_advice_is_recognised():
    assert not specific(ast.parse('"Run the command with --help to see its arguments."').body[0].value, {})
    assert not specific(ast.parse('"Check the resource limits in the containment profile."').body[0].value, {})
    assert specific(ast.parse('"Name another directory with --out."').body[0].value, {})
    assert specific(ast.parse('f"`mkdir -p {parent}`"').body[0].value, {})


def generic_sites() -> Counter[tuple[str, str]]:
    found, parents, defaults, modules = sites()
    errors_constants = _constants(modules[SRC / "errors.py"])
    generic: Counter[tuple[str, str]] = Counter()
    for s in found:
        constants = _constants(modules[s.path])
        default = default_of(s.cls, parents, defaults)
        advice = s.advice if s.advice is not None else default
        if not specific(advice, {**errors_constants, **constants}, default):
            generic[(str(s.path.relative_to(REPO)), s.code)] += 1
    return generic


def test_every_error_site_advises_a_next_step_of_this_run():
    """No error site gives generic advice: each names a file, option, command or value of this run."""
    generic = generic_sites()
    assert not generic, "error sites with generic advice (name a file, option, command or value of this run):\n" + \
        "\n".join(f"{p} {code} x{n}" for (p, code), n in sorted(generic.items()))


def rego_reason_codes() -> set[str]:
    """Every reason code the policies give: the first argument of each ``_reason(...)`` call."""
    codes: set[str] = set()
    for path in (REPO / "policies").rglob("*.rego"):
        if not path.name.endswith("_test.rego"):
            codes |= set(re.findall(r'_reason\(\s*"([a-z_]+)"', path.read_text()))
    return codes


def test_every_policy_reason_that_can_refuse_has_specific_advice():
    from ckptgate.enforce.advice import INFORMATIONAL, REASON_ADVICE

    codes = rego_reason_codes()
    assert len(codes) > 30 and "inspection_not_clean" in codes
    assert codes >= INFORMATIONAL, f"informational codes the policies no longer give: {INFORMATIONAL - codes}"
    assert set(REASON_ADVICE) <= codes, f"advice for codes the policies never give: {set(REASON_ADVICE) - codes}"
    missing = codes - INFORMATIONAL - set(REASON_ADVICE)
    assert not missing, f"deny reasons without advice of their own: {sorted(missing)}"
    vague = [c for c, a in REASON_ADVICE.items() if not SPECIFIC.search(a) or any(g in a for g in GENERIC)]
    assert not vague, f"reason advice that names no command, option or file: {vague}"


@pytest.mark.parametrize("refusal_class", ["input", "policy"])
def test_a_refusal_carries_the_advice_of_the_reason_that_decided_it(refusal_class):
    from ckptgate.decide.decision import Reason
    from ckptgate.enforce.advice import INFORMATIONAL, REASON_ADVICE
    from ckptgate.enforce.gate import refusal

    for code in sorted(rego_reason_codes() - INFORMATIONAL):
        error = refusal([Reason(code=code, message="m")], "d", "r", refusal_class)
        assert REASON_ADVICE[code] in error.diagnostics(), code

