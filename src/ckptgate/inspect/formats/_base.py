"""Shared types of the format detectors."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.budget import WorkBudget
from ckptgate.inspect.files import FileFacts
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.pickle import PickleReport
from ckptgate.inspect.walk import SafeTree

__all__ = ["Context", "FormatResult", "plain_basename"]


@dataclass(slots=True)
class Context:
    """What detectors see: the open tree and the per-file facts, keyed by relative path."""

    tree: SafeTree
    files: dict[str, FileFacts]
    work: WorkBudget | None = None  # the whole tree's work budget, for pickles read during detection

    def under(self, folder: str) -> dict[str, FileFacts]:
        p = folder.rstrip("/") + "/" if folder else ""
        return {k[len(p) :]: v for k, v in self.files.items() if k.startswith(p)}


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatResult:
    format: str
    layout: dict[str, Any]
    loaders: tuple[str, ...]
    findings: tuple[Finding, ...] = ()
    consolidatable: bool = True
    #: pickles the detector read inside other files (a BYTE_IO item of a .distcp file), for the policy
    pickles: tuple[PickleReport, ...] = ()
    #: (path, pickle context) of each file the detector takes as its own in a context a sibling
    #: chose (:data:`ckptgate.inspect.files.SIBLING_CONTEXTS`); any other such file is read again
    #: in its own context
    claims: tuple[tuple[str, str], ...] = ()


def plain_basename(value: Any, path: str, what: str, prefix: str = "index") -> Finding | None:
    """A finding unless ``value`` is a plain file name (no folders, no escapes)."""
    if not isinstance(value, str) or not value:
        return error(f"{prefix}.bad_target", path, f"{what} is not a non-empty string", value=repr(value)[:80])
    bad = (
        "/" in value
        or "\\" in value
        or "\x00" in value
        or value in (".", "..")
        or "%" in value
        or (len(value) > 1 and value[1] == ":")
        or posixpath.basename(value) != value
        or any(ord(ch) < 0x20 for ch in value)
    )
    if bad:
        return error(f"{prefix}.unsafe_target", path, f"{what} {value!r} is not a plain basename", value=value[:200])
    return None
