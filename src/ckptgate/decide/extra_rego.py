"""A consumer repository's extra Rego (``extra_rego``): read, parsed by OPA's own parser, and
refused unless it only adds deny reasons under ``data.ckptgate_consumer``; then offered to the
bundle as overlays under ``extra/``."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ckptgate.decide.bundle import find_opa
from ckptgate.decide.rego_ast import (
    RegoParseError,
    called,
    engine_state_reads,
    is_ref,
    nondeterministic_builtins,
    parse_modules,
    ref_text,
)
from ckptgate.errors import ConfigError, EngineUnavailable
from ckptgate.userfiles import read_regular_file

EXTRA_IN_BUNDLE = "extra/"

#: The package of a consumer repository's extra Rego (``extra_rego``): it and its sub-packages,
#: ``data.ckptgate_consumer...``, are the only place it may define anything.
CONSUMER_PACKAGE = "ckptgate_consumer"
#: The one rule of it that the intake decision reads: ``data.ckptgate_consumer.deny``, a set of
#: ``{code, message}`` objects, each a deny reason ``consumer.<code>`` (``policies/ckptgate/intake/consumer.rego``).
CONSUMER_DENY = "deny"
_ADVICE = (
    "Extra Rego may read data.ckptgate and input, and defines rules only in package "
    f"{CONSUMER_PACKAGE} or a sub-package of it; to refuse a checkpoint, add an element "
    f'{{"code": ..., "message": ...}} to the set data.{CONSUMER_PACKAGE}.{CONSUMER_DENY}, '
    f'e.g. `package {CONSUMER_PACKAGE}` and `deny contains {{"code": "no_fridays", '
    '"message": "..."} if ...`.'
)
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
    try:
        modules = parse_modules(texts, opa, what=f"the extra Rego in {extra}")
    except RegoParseError as e:
        raise ConfigError(
            "usage.config.extra_rego",
            f"extra Rego in {extra} does not parse: {e.message}",
            evidence={"file": str(extra / e.files[0]) if e.files else str(extra), "error": e.message},
            advice=f"Extra Rego is Rego v1 (`if` before rule bodies, `contains` for sets); `opa check {extra}` "
            "names the problem.",
        ) from None
    for rel in sorted(texts):
        _check_module(extra / rel, modules.get(rel), nondeterministic_builtins(opa))
    _passed.add(digest)


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
    package = ref_text(path)
    if not is_ref(path) or path[0] != {"type": "var", "value": "data"}:
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
    for read in engine_state_reads(module):
        raise _refuse(
            file,
            f"reads {ref_text(read)}: extra Rego reads data by name (data.ckptgate, its own package), never "
            "data.system (the engine's own state), the whole of data, or data by a computed key",
            package=package,
            reference=ref_text(read),
        )
    imports = _imports(module.get("imports") or [])
    for rule in module.get("rules") or []:
        head = rule.get("head") if isinstance(rule, dict) else None
        ref = head.get("ref") if isinstance(head, dict) else None
        if not isinstance(head, dict) or not is_ref(ref):
            raise _refuse(file, f"a rule in package {package} has a head OPA did not describe", package=package)
        name = ref_text(ref)
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
                f"the rule {name} starts with the imported name {first} ({ref_text(imports[first])}): it would "
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
        for builtin in called(rule):
            if builtin in nondeterministic:
                raise _refuse(
                    file,
                    f"the rule {name} calls {builtin} (or names it, as a `with` value that a call then runs), which "
                    "OPA marks nondeterministic: extra Rego decides "
                    "from the input and the bundled data only, never the network, the clock, randomness or "
                    "the engine's runtime",
                    package=package,
                    rule=name,
                    builtin=builtin,
                )
        for target in _with_targets(rule):
            terms = target.get("value") if target.get("type") == "ref" else [target]
            if not is_ref(terms):
                continue
            head_var = terms[0].get("value") if terms[0].get("type") == "var" else None
            if isinstance(head_var, str) and head_var in imports:
                terms = [*imports[head_var], *terms[1:]]
            if terms[0] == {"type": "var", "value": "data"} and (
                len(terms) < 2 or terms[1] != {"type": "string", "value": CONSUMER_PACKAGE}
            ):
                overridden = ref_text(terms)
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
        if not is_ref(path) or path[0].get("value") not in ("data", "input"):
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
