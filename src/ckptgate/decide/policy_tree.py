"""A policy tree other than the one ckptgate carries, checked before the embedded engine loads it.

``--policies DIR``, ``$CKPTGATE_POLICIES``, a configuration's ``policies`` (in ``ckptgate check``, the
change under review's) can name any tree.  Its Rego decides, but it is never more than a function of
the inputs the decision names, and it never governs the engine itself:

* no module (tests aside: they never reach the engine) calls or names a builtin OPA marks
  nondeterministic (``http.send`` to a metadata endpoint from CI, ``opa.runtime``, the clock,
  randomness), read from OPA's own parse of it (:mod:`ckptgate.decide.rego_ast`);
* no module or data document defines anything under ``data.system``: the embedded server's
  authorization (``system.authz``, which admits only this run's token) is always the one ckptgate
  carries, staged over the tree's own (:data:`AUTHZ_IN_BUNDLE`).

The bundled tree is loaded as it is: it is ckptgate's own."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ckptgate._resources import policies_dir
from ckptgate.decide.bundle import find_opa, read_policy_files
from ckptgate.decide.rego_ast import RegoParseError, called, is_ref, nondeterministic_builtins, parse_modules, ref_text
from ckptgate.errors import UsageError

__all__ = ["AUTHZ_IN_BUNDLE", "engine_overlays"]

#: The embedded server's authorization policy, always ckptgate's own.
AUTHZ_IN_BUNDLE = "system/authz/authz.rego"


@functools.cache
def _bundled(root: Path) -> dict[str, bytes]:
    return read_policy_files(root)


def engine_overlays(tree: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    """What the engine stages over ``files`` (the snapshot of ``tree`` the decision names): nothing for the
    tree ckptgate carries; for any other, ckptgate's own ``system.authz``, once the tree is checked
    (``usage.policies`` when a module calls a nondeterministic builtin or defines under ``data.system``)."""
    own = policies_dir()
    if own is None:  # an installation without policies: the engine refuses to start on its own
        return {}
    bundled = _bundled(own)
    if files == bundled:
        return {}
    check_tree(tree, files, bundled)
    return {AUTHZ_IN_BUNDLE: bundled[AUTHZ_IN_BUNDLE]} if AUTHZ_IN_BUNDLE in bundled else {}


def check_tree(tree: Path, files: dict[str, bytes], bundled: dict[str, bytes]) -> None:
    """Refuse (``usage.policies``) a tree whose Rego reaches past the inputs, or that defines ``data.system``.
    A file with the bytes ``bundled`` (the tree ckptgate carries) has at the same path is ckptgate's own."""
    texts: dict[str, str] = {}
    for rel, data in sorted(files.items()):
        if rel == AUTHZ_IN_BUNDLE or bundled.get(rel) == data:
            continue  # replaced by ckptgate's own, or ckptgate's own already
        if rel.split("/")[0] == "system" or (rel == "data.json" and _has_system_key(data)):
            raise _refuse(tree, rel, "defines data under data.system, the embedded engine's own namespace")
        if not rel.endswith(".rego"):
            continue
        try:
            texts[rel] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _refuse(tree, rel, f"is not UTF-8 ({e.reason} at byte {e.start})") from None
    if not texts:
        return
    opa = find_opa()
    try:
        modules = parse_modules(texts, opa, what=f"the policy tree {tree}")
    except RegoParseError as e:
        raise UsageError(
            "usage.policies",
            f"the policy tree {tree} does not parse: {e.message}",
            evidence={"file": str(tree / e.files[0]) if e.files else str(tree), "error": e.message},
            advice=f"Policies are Rego v1; `opa check {tree}` names the problem.",
        ) from None
    nondeterministic = nondeterministic_builtins(opa)
    for rel in sorted(texts):
        module = modules.get(rel)
        path = module.get("package", {}).get("path") if isinstance(module, dict) else None
        if not is_ref(path):
            raise _refuse(tree, rel, "has no package OPA could describe")
        if len(path) > 1 and path[1] == {"type": "string", "value": "system"}:
            raise _refuse(tree, rel, f"declares package {ref_text(path)}, the embedded engine's own namespace")
        for builtin in called(module):
            if builtin in nondeterministic:
                raise _refuse(
                    tree,
                    rel,
                    f"calls {builtin} (or names it, as a `with` value that a call then runs), which OPA marks "
                    "nondeterministic: a decision is a function of the inputs it names, never the network, "
                    "the clock, randomness or the engine's runtime",
                    builtin=builtin,
                )


def _has_system_key(data: bytes) -> bool:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False  # OPA refuses malformed data on its own, naming the file
    return isinstance(doc, dict) and "system" in doc


def _refuse(tree: Path, rel: str, why: str, **evidence: str) -> UsageError:
    return UsageError(
        "usage.policies",
        f"{tree / rel} {why}",
        evidence={"file": str(tree / rel), **evidence},
        advice=f"Remove that from {tree / rel}: a policy tree decides from the input and its own data only, "
        "and the embedded engine's authorization (data.system) is ckptgate's own.",
    )
