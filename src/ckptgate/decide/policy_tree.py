"""A policy tree other than the one ckptgate carries, checked before the embedded engine loads it.

``--policies DIR``, ``$CKPTGATE_POLICIES``, a configuration's ``policies`` (in ``ckptgate check``, the
change under review's) can name any tree.  Its Rego decides, but it is never more than a function of
the inputs the decision names, and it never governs the engine itself:

* no module (tests aside: they never reach the engine) calls or names a builtin OPA marks
  nondeterministic (``http.send`` to a metadata endpoint from CI, ``opa.runtime``, the clock,
  randomness) or one that reads the clock unmarked, read from OPA's own parse of it
  (:mod:`ckptgate.decide.rego_ast`);
* no module reads ``data.system`` (the engine's own state: its bundle is keyed by the path of a
  private, randomly named work directory), the whole of ``data``, or ``data[x]`` by a computed key;
* no module or data document defines anything under ``data.system`` (a root ``data.json`` must be
  strict JSON in UTF-8, which OPA reads as Python does): the embedded server's authorization
  (``system.authz``, which admits only this run's token) is always the one ckptgate carries, staged
  over the tree's own (:data:`AUTHZ_IN_BUNDLE`).

The bundled tree is loaded as it is: it is ckptgate's own."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ckptgate._resources import policies_dir
from ckptgate.decide.bundle import find_opa, read_policy_files
from ckptgate.decide.rego_ast import (
    RegoParseError,
    called,
    engine_state_reads,
    is_ref,
    nondeterministic_builtins,
    parse_modules,
    ref_text,
)
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
    (``usage.policies`` when a module calls a nondeterministic builtin or reads or defines ``data.system``).
    An installation that carries no policies has no authorization to stage: a tree is then refused."""
    own = policies_dir()
    if own is not None and tree.resolve() == own.resolve():  # ckptgate's own, by its own path
        return {}
    bundled = _bundled(own) if own is not None else {}
    if own is not None and files == bundled:
        return {}
    if AUTHZ_IN_BUNDLE not in bundled:
        raise UsageError(
            "usage.policies",
            f"this installation of ckptgate carries no policies of its own, so the policy tree {tree} cannot "
            "run behind ckptgate's authorization of the embedded engine",
            evidence={"file": str(tree)},
            advice=f"Reinstall ckptgate from its wheel (it carries policies/), then name {tree} again.",
        )
    check_tree(tree, files, bundled)
    return {AUTHZ_IN_BUNDLE: bundled[AUTHZ_IN_BUNDLE]}


def check_tree(tree: Path, files: dict[str, bytes], bundled: dict[str, bytes]) -> None:
    """Refuse (``usage.policies``) a tree whose Rego reaches past the inputs, or that reads or defines
    ``data.system``.  A file with the bytes ``bundled`` (the tree ckptgate carries) has at the same path is
    ckptgate's own."""
    texts: dict[str, str] = {}
    for rel, data in sorted(files.items()):
        if rel == AUTHZ_IN_BUNDLE or bundled.get(rel) == data:
            continue  # replaced by ckptgate's own, or ckptgate's own already
        if rel.split("/")[0] == "system":
            raise _refuse(tree, rel, "defines data under data.system, the embedded engine's own namespace")
        if rel == "data.json":
            _check_root_data(tree, rel, data)
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
        for read in engine_state_reads(module):
            raise _refuse(
                tree,
                rel,
                f"reads {ref_text(read)}: a policy reads data by name, never data.system (the engine's own "
                "state, such as the path of its private work directory), the whole of data, or data by a "
                "computed key",
                reference=ref_text(read),
            )
        for builtin in called(module):
            if builtin in nondeterministic:
                raise _refuse(
                    tree,
                    rel,
                    f"calls {builtin} (or names it, as a `with` value that a call then runs), which reads the "
                    "network, the clock, randomness or the engine's runtime: a decision is a function of the "
                    "inputs it names",
                    builtin=builtin,
                )


def _check_root_data(tree: Path, rel: str, data: bytes) -> None:
    """The root ``data.json`` must be strict JSON in UTF-8 with no ``system`` key: OPA's decoder accepts what
    Python's refuses (a stray byte becomes U+FFFD), so what cannot be read here is refused, not let through."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        why = "too deeply nested" if isinstance(e, RecursionError) else str(e)[:200]
        raise _refuse(tree, rel, f"is not strict JSON in UTF-8 ({why})") from None
    if isinstance(doc, dict) and "system" in doc:
        raise _refuse(tree, rel, "defines data under data.system, the embedded engine's own namespace")


def _refuse(tree: Path, rel: str, why: str, **evidence: str) -> UsageError:
    return UsageError(
        "usage.policies",
        f"{tree / rel} {why}",
        evidence={"file": str(tree / rel), **evidence},
        advice=f"Remove that from {tree / rel}: a policy tree decides from the input and its own data only, "
        "and the embedded engine's authorization (data.system) is ckptgate's own.",
    )
