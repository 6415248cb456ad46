"""Which of an inspection's error findings the bundled policy excepts by name, and why.

``ckptgate inspect`` decides nothing, but a DeepSpeed checkpoint is never clean as inspected: DeepSpeed
copies ``zero_to_fp32.py`` into it, and the bundled policy data admits that script by name
(``ckptgate/config/intake/data.json``, ``finding_exceptions``).  This reads the same table with the
same rule as ``policies/ckptgate/intake/intake.rego`` (``_exception_applies``): the format, the code
and the path match, and the code is not one of ``code_bearing_findings``, which no exception
covers.  A configuration's policy-data overlay can add exceptions; only ``decide`` and ``intake``
apply those, so this names the bundled ones only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptgate._json import loads_strict
from ckptgate._resources import policies_dir

INTAKE_DATA = ("ckptgate", "config", "intake", "data.json")
_MAX_BYTES = 4 << 20

__all__ = ["Excepted", "bundled_exceptions"]


@dataclass(frozen=True, slots=True)
class Excepted:
    """An error finding (``code`` at ``path``) that the exception ``exception`` admits, for ``why``."""

    code: str
    path: str
    exception: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "path": self.path, "exception": self.exception, "why": self.why}


def _intake_data() -> dict[str, Any]:
    root = policies_dir()
    if root is None:
        return {}
    path = root.joinpath(*INTAKE_DATA)
    try:
        raw = path.read_bytes()[: _MAX_BYTES + 1]
        doc = loads_strict(raw, what=str(path), max_bytes=_MAX_BYTES)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def bundled_exceptions(fmt: str, findings: list[dict[str, Any]]) -> list[Excepted]:
    """The error findings of an inspection of format ``fmt`` that the bundled policy excepts."""
    data = _intake_data()
    code_bearing = set(data.get("code_bearing_findings", {}).get("codes", []))
    found: list[Excepted] = []
    for f in findings:
        if f.get("severity") != "error" or f.get("code") in code_bearing:
            continue
        for e in data.get("finding_exceptions", []):
            if fmt in e.get("formats", []) and f.get("code") == e.get("code") and f.get("path") in e.get("paths", []):
                found.append(Excepted(str(f["code"]), str(f["path"]), str(e.get("id")), str(e.get("why"))))
                break
    return found
