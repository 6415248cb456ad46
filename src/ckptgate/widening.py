"""What widens the gate: a comparison of two sets of decision inputs.

The rule (docs/user-guide.md#precedence): nothing that a change under review can edit may widen the
decision that judges it.  :class:`Effective` is what a set of inputs amounts to once merged (trust
data, intake data, gates, extra Rego); :func:`widenings` lists every way ``new`` admits more than
``base``:

* a signer added to the trust data, or one whose entry changed (its scope may have grown);
* the attestation freshness window, or the clock skew allowed, lengthened;
* a finding exception added;
* an adapter's producer-version gate admitting a version the base does not;
* extra Rego added, changed or removed (reported by ``check --base``; at run time extra Rego only adds
  deny reasons, so it cannot widen);
* the policy tree changed: a Rego file of it added, removed or changed, or any part of its trust,
  intake or gates data other than the four compared above (the refusal mapping, the exceptable
  codes, the code-bearing findings, ...).  Whether such a change widens cannot be read from the
  data, so every one is reported (``check --base``; at run time a discovered policy tree is
  refused unless it is the bundled one).

A value that cannot be compared (a number written with a fraction or an exponent, a key the base
does not have) is reported as widening: only what is provably no wider passes.

The same comparison refuses a discovered configuration that widens the bundled inputs at run time
(:mod:`ckptgate.precedence`) and reports a pull request's widening changes in ``check --base``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ckptgate._json import loads_strict
from ckptgate.decide.bundle import policy_files
from ckptgate.policydata import GATES_IN_BUNDLE, INTAKE_IN_BUNDLE, TRUST_IN_BUNDLE, PolicyData

__all__ = ["Effective", "Widening", "effective", "widenings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Widening:
    """One way the new inputs admit more than the base: a stable code, what, and where."""

    code: str
    message: str
    file: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "file": self.file}


@dataclass(frozen=True, slots=True, kw_only=True)
class Effective:
    """Decision inputs once merged: what the engine and the verifier would use."""

    trust: Mapping[str, Any]
    intake: Mapping[str, Any]
    gates: Mapping[str, Any]
    extra_rego: Mapping[str, bytes] = field(default_factory=dict)
    #: where each part came from, as shown to a reviewer (``trust``, ``overlay``, ``extra_rego``, ``policies``)
    where: Mapping[str, str] = field(default_factory=dict)
    #: the policy tree's other bundled files, Rego and data (relative path -> bytes): every one but
    #: the trust, intake and gates data, which are compared part by part
    policy_files: Mapping[str, bytes] = field(default_factory=dict)


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when it cannot be read or parsed (the command that uses
    the file reports that with its own typed error, and nothing is admitted by an empty document)."""
    try:
        doc = loads_strict(path.read_bytes(), what=str(path))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def effective(
    policy_dir: Path,
    *,
    trust_file: Path | None = None,
    overlay: PolicyData | None = None,
    extra_rego: Path | None = None,
    where: Mapping[str, str] | None = None,
) -> Effective:
    """The merged inputs of a policy tree, an optional trust file, overlay and extra Rego."""
    trust = _read_json(trust_file or policy_dir / TRUST_IN_BUNDLE)
    intake = _read_json(policy_dir / INTAKE_IN_BUNDLE)
    gates = _read_json(policy_dir / GATES_IN_BUNDLE)
    if overlay is not None:
        trust = json.loads(overlay.merge_trust(json.dumps(trust).encode()))
        merged = overlay.overlays(policy_dir)
        intake = json.loads(merged[INTAKE_IN_BUNDLE]) if INTAKE_IN_BUNDLE in merged else intake
        gates = json.loads(merged[GATES_IN_BUNDLE]) if GATES_IN_BUNDLE in merged else gates
    rego: dict[str, bytes] = {}
    if extra_rego is not None and extra_rego.is_dir():
        rego = {p.relative_to(extra_rego).as_posix(): p.read_bytes() for p in sorted(extra_rego.rglob("*.rego"))}
    tree: dict[str, bytes] = {}
    if policy_dir.is_dir():
        compared = {TRUST_IN_BUNDLE, INTAKE_IN_BUNDLE, GATES_IN_BUNDLE}
        files = [p for p in policy_files(policy_dir) if p.relative_to(policy_dir).as_posix() not in compared]
        tree = {p.relative_to(policy_dir).as_posix(): p.read_bytes() for p in files}
    return Effective(
        trust=trust, intake=intake, gates=gates, extra_rego=rego, where=dict(where or {}), policy_files=tree
    )


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def widenings(base: Effective, new: Effective, *, include_rego: bool = True) -> list[Widening]:
    """Every way ``new`` admits more than ``base``, in a stable order."""
    out: list[Widening] = []
    trust_at = new.where.get("trust", "trust data")
    old_signers = {s.get("id"): _canon(s) for s in base.trust.get("signers", []) if isinstance(s, dict)}
    for s in new.trust.get("signers", []):
        if not isinstance(s, dict):
            continue
        sid = s.get("id")
        if sid not in old_signers:
            out.append(Widening(code="widening.signer_added", message=f"signer {sid!r} is added", file=trust_at))
        elif old_signers[sid] != _canon(s):
            out.append(
                Widening(
                    code="widening.signer_changed",
                    message=f"signer {sid!r} is changed (its keys, identities or scope)",
                    file=trust_at,
                )
            )
    data_at = new.where.get("overlay", new.where.get("policies", "policy data"))
    old_fresh, new_fresh = _mapping(base.intake.get("freshness")), _mapping(new.intake.get("freshness"))
    for key in sorted(set(old_fresh) | set(new_fresh)):
        before, after = old_fresh.get(key), new_fresh.get(key)
        if after == before and type(after) is type(before):
            continue
        if _integer(before) and _integer(after) and after <= before:
            continue
        out.append(
            Widening(
                code="widening.freshness_lengthened",
                message=f"freshness {key} is lengthened from {before!r} to {after!r}"
                if _integer(before) and _integer(after)
                else f"freshness {key} is changed from {before!r} to {after!r}, which cannot be shown to be no longer",
                file=data_at,
            )
        )
    old_exceptions = {
        _canon({k: v for k, v in e.items() if k != "overlay"}) for e in base.intake.get("finding_exceptions", [])
    }
    for e in new.intake.get("finding_exceptions", []):
        if _canon({k: v for k, v in e.items() if k != "overlay"}) not in old_exceptions:
            out.append(
                Widening(
                    code="widening.exception_added",
                    message=f"finding exception {e.get('id')!r} for {e.get('code')!r} is added",
                    file=data_at,
                )
            )
    old_gates = base.gates.get("adapters", {})
    for adapter, gate in sorted(new.gates.get("adapters", {}).items()):
        before = old_gates.get(adapter)
        if before is None or not _restriction_within(gate, before):
            out.append(
                Widening(
                    code="widening.gate_widened",
                    message=f"the producer-version gate of {adapter!r} admits versions the base does not",
                    file=data_at,
                )
            )
    out += _policy_tree_changes(base, new)
    if include_rego:
        rego_at = new.where.get("extra_rego", "extra Rego")
        for rel in sorted(set(new.extra_rego) | set(base.extra_rego)):  # removing a deny rule widens too
            if base.extra_rego.get(rel) != new.extra_rego.get(rel):
                how = "removed" if rel not in new.extra_rego else "changed" if rel in base.extra_rego else "added"
                out.append(
                    Widening(
                        code="widening.extra_rego_changed",
                        message=f"extra Rego {rel} is {how}",
                        file=f"{rego_at}/{rel}",
                    )
                )
    return out


def _restriction_within(new: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Whether ``new``'s gate admits no release that ``base``'s does not.  The releases a gate passes
    are the qualified ones (generated, the same for both), narrowed by an overlay's ``versions``: a
    gate without ``versions`` narrows nothing, and one that is version-independent narrows only by it."""
    if base.get("version_independent") and not new.get("version_independent"):
        pass  # becoming version-volatile only narrows
    elif new.get("version_independent") and not base.get("version_independent"):
        return False  # the gate stops applying: any release passes
    base_versions = base.get("versions")
    if base_versions is None:
        return True  # the base is not narrowed: nothing new can admit more
    new_versions = new.get("versions")
    if new_versions is None:
        return False  # the base's narrowing is dropped
    return _versions_within(new_versions, base_versions)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _integer(value: Any) -> TypeGuard[int]:
    """A JSON integer (not a bool, not a number written with a fraction or exponent such as ``1e12``)."""
    return type(value) is int


#: The parts of each policy-data document that :func:`widenings` compares in detail; every other
#: part is compared whole.
_COMPARED = {"trust": ("signers",), "intake": ("freshness", "finding_exceptions")}


def _rest(doc: Mapping[str, Any], skip: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in skip}


def _gates_rest(gates: Mapping[str, Any]) -> dict[str, Any]:
    """The gates data without each adapter's ``versions`` and ``version_independent`` (compared in
    detail by :func:`_restriction_within`)."""
    adapters = gates.get("adapters", {})
    rest = dict(gates)
    if isinstance(adapters, dict):
        rest["adapters"] = {
            name: {k: v for k, v in a.items() if k not in ("versions", "version_independent")}
            if isinstance(a, dict)
            else a
            for name, a in adapters.items()
        }
    return rest


def _policy_tree_changes(base: Effective, new: Effective) -> list[Widening]:
    """The policy tree's files (Rego, and data such as the generated qualified releases) added, removed
    or changed, and its trust, intake and gates data changed outside the parts compared in detail."""
    out: list[Widening] = []
    tree_at = new.where.get("policies", "the policy tree")
    for rel in sorted(set(base.policy_files) | set(new.policy_files)):
        if base.policy_files.get(rel) != new.policy_files.get(rel):
            how = (
                "changed"
                if rel in base.policy_files and rel in new.policy_files
                else ("added" if rel in new.policy_files else "removed")
            )
            out.append(
                Widening(
                    code="widening.policy_tree_changed",
                    message=f"the policy {rel} is {how}",
                    file=f"{tree_at}/{rel}",
                )
            )
    for name, old, now in (
        ("trust", _rest(base.trust, _COMPARED["trust"]), _rest(new.trust, _COMPARED["trust"])),
        ("intake", _rest(base.intake, _COMPARED["intake"]), _rest(new.intake, _COMPARED["intake"])),
        ("gates", _gates_rest(base.gates), _gates_rest(new.gates)),
    ):
        for key in sorted(set(old) | set(now)):
            if _canon(old.get(key)) != _canon(now.get(key)):
                out.append(
                    Widening(
                        code="widening.policy_data_changed",
                        message=f"the {name} data's {key!r} is changed",
                        file=new.where.get("trust" if name == "trust" else "policies", tree_at),
                    )
                )
    return out


def _semver(text: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in str(text).split("."))
    except ValueError:
        return None


def _versions_within(new: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Every version ``new`` admits, ``base`` admits too (unparseable versions: not within)."""
    if base.get("any") is True:
        return True
    if new.get("any") is True:
        return False
    ranges = [(_semver(r.get("min")), _semver(r.get("max_exclusive"))) for r in base.get("ranges", [])]

    def admitted(v: tuple[int, ...] | None, text: str) -> bool:
        if text in base.get("exact", []):
            return True
        return v is not None and any(lo is not None and hi is not None and lo <= v < hi for lo, hi in ranges)

    if not all(admitted(_semver(v), v) for v in new.get("exact", [])):
        return False
    for r in new.get("ranges", []):
        lo, hi = _semver(r.get("min")), _semver(r.get("max_exclusive"))
        if (
            lo is None
            or hi is None
            or not any(a is not None and b is not None and a <= lo and hi <= b for a, b in ranges)
        ):
            return False
    return True
