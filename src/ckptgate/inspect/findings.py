"""Findings: typed, stable-coded facts about a checkpoint that inspection reports.

A finding never stops inspection on its own; an ``error`` finding makes the inspection not clean
(and the CLI exit 4).  Codes are dotted and stable, e.g. ``pickle.global_not_allowed``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

_CODE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


class Severity(enum.StrEnum):
    """How much a finding matters: ``error`` makes an inspection not clean."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One fact found about one path (``""`` for the whole tree)."""

    code: str
    severity: Severity
    path: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _CODE.match(self.code):
            raise ValueError(f"bad finding code {self.code!r}")
        if not isinstance(self.severity, Severity):
            raise TypeError("severity must be a Severity")

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": str(self.severity),
            "path": self.path,
            "message": self.message,
            "evidence": dict(self.evidence),
        }


def error(code: str, path: str, message: str, **evidence: Any) -> Finding:
    return Finding(code=code, severity=Severity.ERROR, path=path, message=message, evidence=evidence)


def warning(code: str, path: str, message: str, **evidence: Any) -> Finding:
    return Finding(code=code, severity=Severity.WARNING, path=path, message=message, evidence=evidence)


def info(code: str, path: str, message: str, **evidence: Any) -> Finding:
    return Finding(code=code, severity=Severity.INFO, path=path, message=message, evidence=evidence)


def finding_from_json(doc: dict[str, Any]) -> Finding:
    """A finding another rank sent as its ``to_json()``."""
    return Finding(
        code=doc["code"],
        severity=Severity(doc["severity"]),
        path=doc["path"],
        message=doc["message"],
        evidence=dict(doc.get("evidence") or {}),
    )
