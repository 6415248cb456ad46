"""The configuration's policy-data overlay (``policy_data = "ckptgate-data.json"``).

A consumer repository adjusts four named parts of the bundled policy data, and nothing else::

    {
      "signers": [ ...trust entries, as `ckptgate attest keygen` writes them... ],
      "freshness": {"max_age_seconds": 86400, "max_clock_skew_seconds": 60},
      "finding_exceptions": [ {"id": ..., "formats": [...], "code": ..., "paths": [...], "why": ...} ],
      "gates": {"dcp": {"versions": {"any": false, "exact": ["2.13.0"], "ranges": []}}}
    }

Merge rule, applied to the policy directory's own data before the bundle is built:

* ``signers`` are **appended** to the trust data (the bundled one, or the configuration's ``trust``);
  a signer id already there is a conflict.  Python verifies signatures with the merged trust data,
  and the engine is given the same bytes.
* ``freshness`` **replaces** the named keys of ``data.ckptgate.config.intake.freshness``.
* ``finding_exceptions`` are **appended** to the bundled ones; an id already there is a conflict.
* ``gates`` sets the ``versions`` of an adapter the bundled gates already name; an unknown adapter is
  a conflict (an overlay cannot add an adapter, which needs code).  Those versions only **narrow**:
  a release passes when it is qualified (the generated ``data.ckptgate.config.qualified``, from
  passing qualifications with retained evidence) *and* inside them, so an overlay can never admit a
  release no qualification vouches for.

Nothing else can be overlaid: the Rego, the loaders and their classes, the refusal mapping and the
claims data stay the bundled ones.  The overlay file is validated against :data:`SCHEMA`, and each
merged document against the bundled JSON schema of its data (``policies/schemas``), so a merge
cannot produce data the policies were not written for.  Every problem is a
:class:`~ckptgate.config.ConfigError` with a ``usage.config.policy_data*`` code (exit 2).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptgate._json import JSONRejected, loads_or_none, loads_strict
from ckptgate.errors import ConfigError
from ckptgate.userfiles import read_regular_file

MAX_POLICY_DATA_BYTES = 4 << 20
INTAKE_IN_BUNDLE = "ckptgate/config/intake/data.json"
GATES_IN_BUNDLE = "ckptgate/config/gates/data.json"
TRUST_IN_BUNDLE = "ckptgate/config/trust/data.json"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "signers": {
            "type": "array",
            "items": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string", "minLength": 1}}},
        },
        "freshness": {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "properties": {
                "max_age_seconds": {"type": "integer", "minimum": 1},
                "max_clock_skew_seconds": {"type": "integer", "minimum": 0, "maximum": 3600},
            },
        },
        "finding_exceptions": {"type": "array", "items": {"type": "object"}},
        "gates": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["versions"],
                "properties": {"versions": {"type": "object"}},
            },
        },
    },
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyData:
    """A validated overlay document and the file it came from."""

    source: Path
    doc: dict[str, Any] = field(repr=False)
    #: sha256 of the overlay file's bytes, as parsed
    sha256: str = ""

    @property
    def signers(self) -> list[dict[str, Any]]:
        return list(self.doc.get("signers", []))

    def merge_trust(self, raw: bytes) -> bytes:
        """``raw`` trust data with the overlay's signers appended (``raw`` itself when it adds none)."""
        if not self.signers:
            return raw
        trust = loads_or_none(raw)
        if not isinstance(trust, dict):  # the trust data's own parser reports it, with its own code
            return raw
        present = {s.get("id") for s in trust.get("signers", []) if isinstance(s, dict)}
        for s in self.signers:
            if s["id"] in present:
                raise self._error(
                    "usage.config.policy_data_conflict",
                    f"signer {s['id']!r} is already in the trust data; an overlay adds signers, it cannot replace one",
                    key="signers",
                )
            present.add(s["id"])
        trust["signers"] = [*trust.get("signers", []), *self.signers]
        return json.dumps(trust, indent=2, sort_keys=True).encode()

    def overlays(self, policy_dir: Path) -> dict[str, bytes]:
        """Bundle overlays (bundle-relative path -> bytes) for the intake and gates data, merged over
        ``policy_dir``'s own and checked against its schemas.  Trust is merged by :meth:`merge_trust`."""
        out: dict[str, bytes] = {}
        if "freshness" in self.doc or "finding_exceptions" in self.doc:
            intake = _read(policy_dir / INTAKE_IN_BUNDLE)
            intake["freshness"] = {**intake.get("freshness", {}), **self.doc.get("freshness", {})}
            ids = {e.get("id") for e in intake.get("finding_exceptions", [])}
            exceptable = set(intake.get("exceptable_codes", []))
            for e in self.doc.get("finding_exceptions", []):
                if e.get("code") not in exceptable:
                    raise self._error(
                        "usage.config.policy_data_not_exceptable",
                        f"finding exception {e.get('id')!r}: the finding {e.get('code')!r} is not one the bundled "
                        f"policy data marks exceptable ({', '.join(sorted(exceptable)) or 'none'}); a finding that "
                        "bears code (auto_map, custom pipelines, dynamic-module references, pickle globals outside "
                        "the allowlists, code files) is excepted only by the bundled policy",
                        key="finding_exceptions",
                    )
                if e.get("id") in ids:
                    raise self._error(
                        "usage.config.policy_data_conflict",
                        f"finding exception {e.get('id')!r} is already in the bundled data; an overlay adds exceptions",
                        key="finding_exceptions",
                    )
                ids.add(e.get("id"))
            intake["finding_exceptions"] = [
                *intake.get("finding_exceptions", []),
                # marked, so the policy applies them only to exceptable codes whatever else was merged
                *({**e, "overlay": True} for e in self.doc.get("finding_exceptions", [])),
            ]
            self._check(intake, policy_dir, "intake")
            out[INTAKE_IN_BUNDLE] = json.dumps(intake, indent=2, sort_keys=True).encode()
        if "gates" in self.doc:
            gates = _read(policy_dir / GATES_IN_BUNDLE)
            for adapter, gate in self.doc["gates"].items():
                if adapter not in gates.get("adapters", {}):
                    raise self._error(
                        "usage.config.policy_data_conflict",
                        f"gates: the bundled policies have no "
                        f"adapter {adapter!r}; an overlay can change an adapter's versions, not add one",
                        key=f"gates.{adapter}",
                    )
                gates["adapters"][adapter] = {**gates["adapters"][adapter], "versions": gate["versions"]}
            self._check(gates, policy_dir, "gates")
            out[GATES_IN_BUNDLE] = json.dumps(gates, indent=2, sort_keys=True).encode()
        return out

    def _check(self, merged: dict[str, Any], policy_dir: Path, name: str) -> None:
        # Measured start-up cost: jsonschema is over 100 ms (python -X importtime) that every command
        # reading a configuration would pay (ckptgate.config imports this module); only an overlay needs it.
        import jsonschema  # noqa: PLC0415 — measured start-up cost, above

        schema_file = policy_dir / "schemas" / name / "schema.json"
        if not schema_file.is_file():  # a policy directory without schemas: the overlay schema alone applies
            return
        errors = sorted(
            jsonschema.Draft7Validator(_read(schema_file)).iter_errors(merged), key=lambda e: list(e.absolute_path)
        )
        if errors:
            e = errors[0]
            where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
            raise self._error(
                "usage.config.policy_data",
                f"the merged {name} data does not match its schema at {where}: {e.message}",
                key=where,
            )

    def _error(self, code: str, message: str, *, key: str) -> ConfigError:
        return ConfigError(
            code,
            f"{self.source}: {message}",
            evidence={"file": str(self.source), "key": key},
            advice="Fix the policy-data overlay; the user guide's Configuration section "
            "lists what each key may change.",
        )


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = loads_strict(path.read_bytes(), what=str(path))
    except OSError as e:
        raise ConfigError(
            "usage.config.policy_data", f"cannot read {path}: {e.strerror or e}", evidence={"file": str(path)}
        ) from None
    except JSONRejected as bad:
        raise ConfigError("usage.config.policy_data", bad.message, evidence={"file": str(path)}) from None
    if not isinstance(doc, dict):
        raise ConfigError("usage.config.policy_data", f"{path} is not a JSON object", evidence={"file": str(path)})
    return doc


def load(path: Path) -> PolicyData:
    """Read and validate an overlay file (a JSON object; see the module docstring)."""
    import jsonschema  # noqa: PLC0415 — measured start-up cost (see _check)

    def error(code: str, message: str, key: str = "(top level)") -> ConfigError:
        return ConfigError(code, f"{path}: {message}", evidence={"file": str(path), "key": key})

    try:
        raw = read_regular_file(path, limit=MAX_POLICY_DATA_BYTES)
    except OSError as e:
        raise error("usage.config.policy_data", f"cannot read it: {e.strerror or e}") from None
    if len(raw) > MAX_POLICY_DATA_BYTES:
        raise error("usage.config.policy_data", f"over {MAX_POLICY_DATA_BYTES} bytes")
    try:
        doc = loads_strict(raw, what="the policy-data overlay")
    except JSONRejected as bad:  # also too deep for the parser, a repeated key, NaN: exit 2, never a traceback
        raise error("usage.config.policy_data", f"not JSON: {bad.reason}") from None
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        key = ".".join(str(p) for p in first.absolute_path) or "(top level)"
        unknown = first.validator == "additionalProperties"
        code = "usage.config.policy_data_unknown_key" if unknown else "usage.config.policy_data"
        raise error(code, f"{key}: {first.message}", key)
    return PolicyData(source=path, doc=copy.deepcopy(doc), sha256="sha256:" + hashlib.sha256(raw).hexdigest())


__all__ = ["SCHEMA", "PolicyData", "load"]
