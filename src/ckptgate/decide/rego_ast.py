"""Rego read as OPA parses it: modules parsed by OPA's own parser (``rego.parse_module``) into its JSON
AST, and the names of the builtins OPA marks nondeterministic that a module calls or names.

Used where Rego that ckptgate does not ship is loaded into a decision: a consumer's extra Rego
(:mod:`ckptgate.decide.extra_rego`) and a policy tree other than the bundled one
(:mod:`ckptgate.decide.policy_tree`).  A decision is a function of the inputs it names, so neither
may reach the network, the clock, randomness or the engine's runtime."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any, TypeGuard

from ckptgate.errors import EngineUnavailable

__all__ = [
    "RegoParseError",
    "called",
    "engine_state_reads",
    "is_ref",
    "nondeterministic_builtins",
    "parse_modules",
    "ref_text",
]

#: Parse every file in one OPA process, with OPA's own parser (the one that loads the bundle);
#: ``--strict-builtin-errors`` makes a file that does not parse an error rather than a missing key.
_PARSE_QUERY = "{name: rego.parse_module(name, text) | some name, text in input}"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Builtins OPA does not mark nondeterministic that read the clock all the same: a certificate chain is
#: verified as of now, so one with a NotAfter of the author's choosing flips a decision on that date.
CLOCK_READING = frozenset(
    {"crypto.x509.parse_and_verify_certificates", "crypto.x509.parse_and_verify_certificates_with_options"}
)


class RegoParseError(Exception):
    """A module OPA's parser refused: ``message`` is OPA's, ``files`` the names it mentions.  Each caller
    raises its own typed error from it (the option that named the Rego is the caller's to name)."""

    def __init__(self, message: str, files: list[str]) -> None:
        super().__init__(message)
        self.message, self.files = message, files


def parse_modules(texts: dict[str, str], opa: str, *, what: str) -> dict[str, Any]:
    """``{name: module AST}`` for every ``{name: Rego text}``, parsed by OPA in one process;
    :class:`RegoParseError` when one does not parse, ``engine.bundle.build_failed`` when OPA did not
    answer (``what`` names the Rego in that message)."""
    try:
        proc = subprocess.run(
            [opa, "eval", "--strict-builtin-errors", "--stdin-input", "--format", "json", _PARSE_QUERY],
            input=json.dumps(texts),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineUnavailable("engine.bundle.build_failed", f"OPA could not parse {what}: {e}") from None
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = None
    if proc.returncode == 0 and isinstance(doc, dict):
        with contextlib.suppress(KeyError, IndexError, TypeError):
            modules = doc["result"][0]["expressions"][0]["value"]
            if isinstance(modules, dict) and set(modules) == set(texts):
                return modules
    errors = doc.get("errors") if isinstance(doc, dict) else None
    message = "; ".join(str(e.get("message", "")) for e in errors if isinstance(e, dict)) if errors else ""
    if "rego_parse_error" not in message:
        raise EngineUnavailable(
            "engine.bundle.build_failed",
            f"OPA could not parse {what}: {(message or proc.stderr or proc.stdout).strip()[:2000]}",
        )
    message = message.removeprefix("rego.parse_module: ")
    raise RegoParseError(message[:2000], [name for name in sorted(texts) if f"{name}:" in message])


@functools.cache
def nondeterministic_builtins(opa: str) -> frozenset[str]:
    """The builtins this OPA marks nondeterministic (``opa capabilities --current``): the network
    (``http.send``, ``net.lookup_ip_addr``), the engine's runtime and environment (``opa.runtime``), the
    clock and randomness, and schema checks that may fetch a remote ``$ref``; and those that read the
    clock unmarked (:data:`CLOCK_READING`)."""
    try:
        proc = subprocess.run([opa, "capabilities", "--current"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineUnavailable("engine.bundle.build_failed", f"{opa} did not list its builtins: {e}") from None
    names: set[str] = set()
    with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError, AttributeError):
        names = {b["name"] for b in json.loads(proc.stdout)["builtins"] if b.get("nondeterministic")}
    if "http.send" not in names:  # every supported OPA marks it: anything else is not OPA's answer
        raise EngineUnavailable(
            "engine.bundle.build_failed",
            f"{opa} did not list its builtins (opa capabilities --current): {(proc.stderr or proc.stdout)[:500]}",
        )
    return frozenset(names | CLOCK_READING)


def called(node: Any) -> Iterator[str]:
    """The name of every function called or named anywhere in ``node``: every reference and variable term
    (a call term's operator and a bare call's first term are references too), except the target of a
    ``with``.  A name alone calls a builtin where a ``with`` value replaces a function with it
    (``f(x) with f as http.send`` runs ``http.send(x)``), so a name counts as a call; a ``with`` target
    is what is replaced (``with http.send as mock``), never called."""
    if isinstance(node, dict):
        if node.get("type") in ("ref", "var"):
            value = node.get("value")
            if node.get("type") == "var" and isinstance(value, str):
                yield value
            elif is_ref(value):
                yield ref_text(value)
        withs = node.get("with")
        for w in withs if isinstance(withs, list) else []:
            if isinstance(w, dict):
                yield from called({k: v for k, v in w.items() if k != "target"})
                target = w.get("target")
                # a target's dynamic parts are evaluated: `with data.x[http.send(r)] as 1`
                if isinstance(target, dict) and is_ref(target.get("value")):
                    for part in target["value"][1:]:
                        yield from called(part)
        for k, v in node.items():
            if k != "with":
                yield from called(v)
    elif isinstance(node, list):
        for v in node:
            yield from called(v)


def engine_state_reads(node: Any) -> Iterator[list[dict[str, Any]]]:
    """The terms of every reference anywhere in ``node`` (imports, bodies, ``with`` targets and values, rule
    heads' values, comprehensions) that reads ``data.system`` (the engine's own state: its bundle is keyed
    by the path of a private, randomly named work directory), the whole of ``data`` (a bare ``data`` is a
    reference of one term, and ``walk(data)`` reaches ``data.system``), or ``data[x]`` by a computed key."""
    if isinstance(node, dict):
        value = node.get("value")
        if node.get("type") == "ref" and is_ref(value) and value[0] == {"type": "var", "value": "data"}:
            named = len(value) > 1 and value[1].get("type") == "string" and value[1].get("value") != "system"
            if not named:
                yield value
        for v in node.values():
            yield from engine_state_reads(v)
    elif isinstance(node, list):
        for v in node:
            yield from engine_state_reads(v)


def is_ref(terms: Any) -> TypeGuard[list[dict[str, Any]]]:
    return isinstance(terms, list) and bool(terms) and all(isinstance(t, dict) for t in terms)


def ref_text(terms: Any) -> str:
    """A reference as Rego writes it: ``data.ckptgate_consumer["x y"]``, ``deny[x]``."""
    if not is_ref(terms):
        return repr(terms)
    out = str(terms[0].get("value"))
    for t in terms[1:]:
        value = t.get("value")
        if t.get("type") == "string" and isinstance(value, str) and _IDENTIFIER.match(value):
            out += f".{value}"
        elif t.get("type") == "string":
            out += f"[{json.dumps(value)}]"
        elif t.get("type") == "var":
            out += f"[{value}]"
        elif t.get("type") == "ref":
            out += f"[{ref_text(value)}]"
        elif t.get("type") in ("number", "boolean", "null"):
            out += f"[{json.dumps(value)}]"
        else:  # a call, a comprehension, a composite: computed, not named
            out += f"[<{t.get('type')}>]"
    return out
