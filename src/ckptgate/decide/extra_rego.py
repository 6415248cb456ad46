"""A consumer repository's extra Rego (``extra_rego``): read, parsed by OPA's own parser, and
refused unless it only adds deny reasons under ``data.ckptgate_consumer``; then offered to the
bundle as overlays under ``extra/``."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

from ckptgate.decide.bundle import find_opa
from ckptgate.errors import ConfigError, EngineUnavailable
from ckptgate.userfiles import read_regular_file

EXTRA_IN_BUNDLE = "extra/"

#: The package of a consumer repository's extra Rego (``extra_rego``): it and its sub-packages,
#: ``data.ckptgate_consumer...``, are the only place it may define anything.
CONSUMER_PACKAGE = "ckptgate_consumer"
#: The one rule of it that the intake decision reads: ``data.ckptgate_consumer.deny``, a set of
#: ``{code, message}`` objects, each a deny reason ``consumer.<code>`` (``policies/ckptgate/intake/consumer.rego``).
CONSUMER_DENY = "deny"
#: Parse every file in one OPA process, with OPA's own parser (the one that loads the bundle);
#: ``--strict-builtin-errors`` makes a file that does not parse an error rather than a missing key.
_PARSE_QUERY = "{name: rego.parse_module(name, text) | some name, text in input}"
_ADVICE = (
    "Extra Rego may read data.ckptgate and input, and defines rules only in package "
    f"{CONSUMER_PACKAGE} or a sub-package of it; to refuse a checkpoint, add an element "
    f'{{"code": ..., "message": ...}} to the set data.{CONSUMER_PACKAGE}.{CONSUMER_DENY}, '
    f'e.g. `package {CONSUMER_PACKAGE}` and `deny contains {{"code": "no_fridays", '
    '"message": "..."} if ...`.'
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: sha256 of extra Rego sources that passed :func:`_check_sources` in this process.
_passed: set[str] = set()

MAX_EXTRA_REGO_BYTES = 1 << 20
"""The largest module of extra Rego read (1 MiB)."""


def extra_rego_files(extra: Path) -> list[Path]:
    """Every ``*.rego`` file under ``extra``, tests included, sorted.  A symbolic link to a directory is
    refused (``usage.config.extra_rego``): the checker never follows one, and ``opa test`` would."""
    found = []
    for dirpath, dirnames, filenames in os.walk(extra, followlinks=False):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if (here / name).is_symlink():
                link = here / name
                raise ConfigError(
                    "usage.config.extra_rego",
                    f"{link} is a symbolic link to a directory: extra Rego is read only from regular files and "
                    f"directories inside {extra}",
                    evidence={"file": str(link), "key": "extra_rego"},
                    advice=f"Replace the link {link} with the directory and files it points to, inside {extra}.",
                )
        found += [here / n for n in filenames if n.endswith(".rego")]
    return sorted(found)


def check_extra_rego(extra: Path, *, where: str = "the configuration") -> None:
    """The extra Rego directory exists and, as OPA itself parses it, defines rules only under
    ``data.ckptgate_consumer`` (:func:`extra_rego_overlays` says what else is refused).

    Without an OPA binary the parse waits for :func:`extra_rego_overlays`, which the engine and
    ``ckptgate check`` call before loading any of it, so a configuration that a command without
    the embedded engine reads needs no OPA."""
    sources = _read_extra(extra, where)
    try:
        opa = find_opa()
    except EngineUnavailable:
        return
    _check_sources(extra, sources, opa)


def checked_extra_rego(extra: Path) -> dict[str, bytes]:
    """Every file of the extra Rego, tests included, ``{relative path: bytes}``, read once and checked
    as :func:`extra_rego_overlays` checks it: what ``ckptgate check`` stages for ``opa test``, ``opa fmt``
    and ``regal lint``, so the tools run on the bytes checked."""
    sources = _read_extra(extra, "the configuration")
    _check_sources(extra, sources, find_opa())
    return sources


def extra_rego_overlays(extra: Path) -> dict[str, bytes]:
    """The extra Rego (tests excluded) as bundle overlays under ``extra/``, a directory the bundled
    policies do not use, so no bundled file is ever overwritten.

    Each file (tests included: ``ckptgate check`` runs them beside the bundled policies) is parsed
    by OPA, and the directory is refused (``usage.config.extra_rego``) unless every file's package
    is ``ckptgate_consumer`` or below it, no rule head starts with ``data``, ``input`` or an
    imported name, ``deny`` in ``ckptgate_consumer`` is neither a function nor an object, and no
    ``with`` overrides ``data`` outside ``data.ckptgate_consumer``.  So the extra Rego can read
    the bundled policies and the input but can only add deny reasons: the decision reads nothing
    of it but ``data.ckptgate_consumer.deny``.  The bytes checked are the bytes returned."""
    sources = checked_extra_rego(extra)
    return {f"{EXTRA_IN_BUNDLE}{rel}": data for rel, data in sources.items() if not rel.endswith("_test.rego")}


def _read_extra(extra: Path, where: str) -> dict[str, bytes]:
    if not extra.is_dir():
        raise ConfigError(
            "usage.config.path",
            f"{where}: extra_rego {extra} is not a directory",
            evidence={"file": where, "key": "extra_rego"},
        )
    out = {}
    for f in extra_rego_files(extra):
        try:
            # never through a link (a committed extra_rego/x.rego -> /proc/self/environ would be quoted back
            # in OPA's parse error), never more than a module can be
            raw = read_regular_file(f, limit=MAX_EXTRA_REGO_BYTES, follow_symlinks=False)
        except OSError as e:
            raise ConfigError(
                "usage.config.extra_rego",
                f"cannot read {f}: {e.strerror or e} (a symbolic link is not read)",
                evidence={"file": str(f)},
                advice=f"Make {f} a regular Rego file inside {extra}, not a link.",
            ) from None
        if len(raw) > MAX_EXTRA_REGO_BYTES:
            raise ConfigError(
                "usage.config.extra_rego",
                f"{f} is larger than {MAX_EXTRA_REGO_BYTES} bytes",
                evidence={"file": str(f), "limit": MAX_EXTRA_REGO_BYTES},
                advice=f"Split {f} or shorten it: a module of extra Rego is at most {MAX_EXTRA_REGO_BYTES} bytes.",
            )
        out[f.relative_to(extra).as_posix()] = raw
    return out


def _check_sources(extra: Path, sources: dict[str, bytes], opa: str) -> None:
    """Parse ``sources`` with OPA and refuse anything that defines outside ``data.ckptgate_consumer``."""
    digest = hashlib.sha256(json.dumps({k: v.hex() for k, v in sorted(sources.items())}).encode()).hexdigest()
    if digest in _passed or not sources:
        return
    texts = {}
    for rel, data in sources.items():
        try:
            texts[rel] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                "usage.config.extra_rego", f"cannot read {extra / rel}: {e}", evidence={"file": str(extra / rel)}
            ) from None
    modules = _parse_modules(extra, texts, opa)
    for rel in sorted(texts):
        _check_module(extra / rel, modules.get(rel), _nondeterministic_builtins(opa))
    _passed.add(digest)


def _parse_modules(extra: Path, texts: dict[str, str], opa: str) -> dict[str, Any]:
    """``{relative path: module AST}``, parsed by OPA (``rego.parse_module``) in one process."""
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
        raise EngineUnavailable("engine.bundle.build_failed", f"OPA could not parse the extra Rego: {e}") from None
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
            f"OPA could not parse the extra Rego in {extra}: {(message or proc.stderr or proc.stdout).strip()[:2000]}",
        )
    message = message.removeprefix("rego.parse_module: ")
    named = [rel for rel in sorted(texts) if f"{rel}:" in message]
    raise ConfigError(
        "usage.config.extra_rego",
        f"extra Rego in {extra} does not parse: {message[:2000]}",
        evidence={"file": str(extra / named[0]) if named else str(extra), "error": message[:2000]},
        advice="Extra Rego is Rego v1 (`if` before rule bodies, `contains` for sets); `opa check` names the problem.",
    )


@functools.cache
def _nondeterministic_builtins(opa: str) -> frozenset[str]:
    """The builtins this OPA marks nondeterministic (``opa capabilities --current``): the network
    (``http.send``, ``net.lookup_ip_addr``), the engine's runtime and environment (``opa.runtime``), the
    clock and randomness, and schema checks that may fetch a remote ``$ref``."""
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
    return frozenset(names)


def _refuse(file: Path, message: str, **evidence: str) -> ConfigError:
    return ConfigError(
        "usage.config.extra_rego",
        f"{file}: {message}",
        evidence={"file": str(file), **evidence},
        advice=_ADVICE,
    )


def _check_module(file: Path, module: Any, nondeterministic: frozenset[str]) -> None:
    """Refuse a parsed module (OPA's JSON AST) that defines anything outside ``data.ckptgate_consumer``,
    or that calls a builtin in ``nondeterministic``: a decision is a function of the inputs it names, and a
    judged change must not reach the network (``http.send`` to a metadata endpoint) or the engine's runtime."""
    if not isinstance(module, dict) or not isinstance(module.get("package"), dict):
        raise _refuse(file, "OPA returned no module for this file")
    path = module["package"].get("path")
    package = _ref_text(path)
    if not _is_ref(path) or path[0] != {"type": "var", "value": "data"}:
        raise _refuse(file, f"the package {package} is not under data", package=package)
    if len(path) < 2 or path[1] != {"type": "string", "value": CONSUMER_PACKAGE}:
        root = path[1].get("value") if len(path) > 1 else None
        why = "the bundled policies' namespace" if root in ("ckptgate", "system") else "outside the consumer namespace"
        raise _refuse(
            file,
            f"declares package {package}, {why}: extra Rego defines rules only in package "
            f"{CONSUMER_PACKAGE} or below it, so it can add deny reasons but never change a bundled rule",
            package=package,
        )
    if len(path) > 2 and path[2] == {"type": "string", "value": CONSUMER_DENY}:
        raise _refuse(
            file,
            f"declares package {package}: data.{CONSUMER_PACKAGE}.{CONSUMER_DENY} is the set of deny "
            "reasons the decision reads, not a package",
            package=package,
        )
    imports = _imports(module.get("imports") or [])
    for rule in module.get("rules") or []:
        head = rule.get("head") if isinstance(rule, dict) else None
        ref = head.get("ref") if isinstance(head, dict) else None
        if not isinstance(head, dict) or not _is_ref(ref):
            raise _refuse(file, f"a rule in package {package} has a head OPA did not describe", package=package)
        name = _ref_text(ref)
        first = ref[0].get("value")
        if ref[0].get("type") == "var" and first in ("data", "input"):
            raise _refuse(
                file,
                f"the rule {name} starts with {first}: rule heads are relative to the package {package}",
                package=package,
                rule=name,
            )
        if ref[0].get("type") == "var" and first in imports:
            raise _refuse(
                file,
                f"the rule {name} starts with the imported name {first} ({_ref_text(imports[first])}): it would "
                f"define {package}.{name}, not the imported document; name the rule otherwise",
                package=package,
                rule=name,
            )
        if len(path) == 2 and first == CONSUMER_DENY and (len(ref) > 1 or head.get("args")):
            raise _refuse(
                file,
                f"the rule {name} is not the set data.{CONSUMER_PACKAGE}.{CONSUMER_DENY}: write it as "
                f'`{CONSUMER_DENY} contains {{"code": ..., "message": ...}} if ...`',
                package=package,
                rule=name,
            )
        for called in _called(rule):
            if called in nondeterministic:
                raise _refuse(
                    file,
                    f"the rule {name} calls {called} (or names it, as a `with` value that a call then runs), which "
                    "OPA marks nondeterministic: extra Rego decides "
                    "from the input and the bundled data only, never the network, the clock, randomness or "
                    "the engine's runtime",
                    package=package,
                    rule=name,
                    builtin=called,
                )
        for target in _with_targets(rule):
            terms = target.get("value") if target.get("type") == "ref" else [target]
            if not _is_ref(terms):
                continue
            head_var = terms[0].get("value") if terms[0].get("type") == "var" else None
            if isinstance(head_var, str) and head_var in imports:
                terms = [*imports[head_var], *terms[1:]]
            if terms[0] == {"type": "var", "value": "data"} and (
                len(terms) < 2 or terms[1] != {"type": "string", "value": CONSUMER_PACKAGE}
            ):
                overridden = _ref_text(terms)
                raise _refuse(
                    file,
                    f"the rule {name} overrides {overridden} with `with`: extra Rego may override input, "
                    f"functions and data.{CONSUMER_PACKAGE} only, so that it judges the same data.ckptgate "
                    "and data.system that decide (an override there would evaluate the bundled rules "
                    "against data that does not decide)",
                    package=package,
                    rule=name,
                    target=overridden,
                )


def _imports(imports: list[Any]) -> dict[str, list[Any]]:
    """``{name: path terms}`` for each import of ``data`` or ``input`` (by alias, else its last key)."""
    out: dict[str, list[Any]] = {}
    for imp in imports:
        term = imp.get("path") if isinstance(imp, dict) else None
        if not isinstance(term, dict):
            continue
        path = [term] if term.get("type") == "var" else term.get("value")  # `import data`, or a ref
        if not _is_ref(path) or path[0].get("value") not in ("data", "input"):
            continue
        name = imp.get("alias") or path[-1].get("value")
        if isinstance(name, str):
            out[name] = path
    return out


def _with_targets(node: Any) -> Iterator[dict[str, Any]]:
    """The target term of every ``with`` anywhere in ``node`` (bodies, else branches, comprehensions)."""
    if isinstance(node, dict):
        withs = node.get("with")
        for w in withs if isinstance(withs, list) else []:
            if isinstance(w, dict) and isinstance(w.get("target"), dict):
                yield w["target"]
        for v in node.values():
            yield from _with_targets(v)
    elif isinstance(node, list):
        for v in node:
            yield from _with_targets(v)


def _called(node: Any) -> Iterator[str]:
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
            elif _is_ref(value):
                yield _ref_text(value)
        withs = node.get("with")
        for w in withs if isinstance(withs, list) else []:
            if isinstance(w, dict):
                yield from _called({k: v for k, v in w.items() if k != "target"})
                target = w.get("target")
                # a target's dynamic parts are evaluated: `with data.x[http.send(r)] as 1`
                if isinstance(target, dict) and _is_ref(target.get("value")):
                    for part in target["value"][1:]:
                        yield from _called(part)
        for k, v in node.items():
            if k != "with":
                yield from _called(v)
    elif isinstance(node, list):
        for v in node:
            yield from _called(v)


def _is_ref(terms: Any) -> TypeGuard[list[dict[str, Any]]]:
    return isinstance(terms, list) and bool(terms) and all(isinstance(t, dict) for t in terms)


def _ref_text(terms: Any) -> str:
    """A reference as Rego writes it: ``data.ckptgate_consumer["x y"]``, ``deny[x]``."""
    if not _is_ref(terms):
        return repr(terms)
    out = str(terms[0].get("value"))
    for t in terms[1:]:
        value = t.get("value")
        if t.get("type") == "string" and isinstance(value, str) and _IDENTIFIER.match(value):
            out += f".{value}"
        elif t.get("type") == "string":
            out += f"[{json.dumps(value)}]"
        else:
            out += f"[{value if t.get('type') == 'var' else json.dumps(value)}]"
    return out
