"""The :class:`Inspection` record and :func:`inspect_tree`, which composes walk, readers and detectors."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate.errors import InputRejected
from ckptgate.inspect._threads import map_in_threads
from ckptgate.inspect.budget import WorkBudget
from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.files import SIBLING_CONTEXTS, FileFacts, analyse_file
from ckptgate.inspect.findings import Finding, Severity, error
from ckptgate.inspect.formats import Context, FormatResult, detect_format
from ckptgate.inspect.pickle import PickleReport
from ckptgate.inspect.topology import empty_paths, measured_topology
from ckptgate.inspect.walk import FileEntry, SafeTree, WalkLimits
from ckptgate.inspect.zipcheck import CrcMode

__all__ = ["LOADERS", "Inspection", "inspect_open_tree", "inspect_tree"]

#: The limits of a walk when the caller names none (frozen, so one instance serves every call).
_DEFAULT_WALK_LIMITS = WalkLimits()
LOADERS = ("safetensors", "json", "static_pickle", "torch_load", "deepspeed")


@dataclass(frozen=True, slots=True, kw_only=True)
class Inspection:
    """Facts about one checkpoint tree."""

    format: str
    files: tuple[FileFacts, ...]
    findings: tuple[Finding, ...]
    loaders: tuple[str, ...]
    layout: dict[str, Any]
    pickles: tuple[PickleReport, ...]
    consolidatable: bool

    def __post_init__(self) -> None:
        if any(ld not in LOADERS for ld in self.loaders):
            raise ValueError(f"unknown loader in {self.loaders}")

    def with_findings(self, extra: list[Finding]) -> Inspection:
        """This inspection with ``extra`` findings merged in (those of a deferred CRC pass)."""
        return dataclasses.replace(self, findings=_ordered([*self.findings, *extra]))

    @property
    def clean(self) -> bool:
        """No error finding, and every pickle stayed inside its allowlist."""
        return not any(f.severity == Severity.ERROR for f in self.findings) and all(
            p.inside_allowlist for p in self.pickles
        )

    def to_facts(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "clean": self.clean,
            "consolidatable": self.consolidatable,
            "loaders": list(self.loaders),
            "findings": [f.to_json() for f in self.findings],
            "files": [f.to_json() for f in self.files],
            "pickles": {p.path: p.to_json() for p in self.pickles},
            "layout": self.layout,
            "topology": measured_topology(self.format, self.layout, empty_paths(self.files)),
        }


def inspect_open_tree(tree: SafeTree, *, verify_crc: CrcMode = True) -> Inspection:
    """Inspect an already opened tree (so a digest can share the same descriptors)."""
    findings: list[Finding] = list(tree.findings)
    facts: dict[str, FileFacts] = {}
    tensors = _TensorCount(tree.limits.max_tensors)
    work = WorkBudget(tree.limits.work, sum(e.size for e in tree.entries))

    def analyse(e: FileEntry, sibling_contexts: bool = True) -> tuple[FileFacts, list[Finding]]:
        work.charge(0, e.path)  # once the intake's budget is spent, no further file is even opened
        try:
            done = analyse_file(tree, e.path, verify_crc=verify_crc, work=work, sibling_contexts=sibling_contexts)
        except InputRejected:
            raise
        except Exception as exc:  # a reader crash is a reject, never "clean"
            return (
                FileFacts(path=e.path, size=e.size, kind=FileKind.UNKNOWN, detail="reader failed"),
                [
                    error(
                        "inspect.reader_failed",
                        e.path,
                        f"the reader failed on this file: {type(exc).__name__}",
                        exception=type(exc).__name__,
                    )
                ],
            )
        if sibling_contexts:  # a file read again is counted once
            tensors.add(done[0])
        return done

    per_file: dict[str, list[Finding]] = {}
    for e, (f, fs) in zip(tree.entries, map_in_threads(analyse, tree.entries, lambda e: e.size), strict=True):
        facts[e.path], per_file[e.path] = f, fs
    res = _detect(tree, facts, work, verify_crc)
    # A context a sibling chose (metadata.json beside common.pt) holds only for a file the detected
    # format claims as its own; any other is read again in its own context, and detected again.
    unclaimed = [
        e
        for e in tree.entries
        if (p := facts[e.path].pickle) is not None
        and p.context in SIBLING_CONTEXTS
        and (e.path, p.context) not in res.claims
    ]
    if unclaimed:
        for e in unclaimed:
            facts[e.path], per_file[e.path] = analyse(e, sibling_contexts=False)
        res = _detect(tree, facts, work, verify_crc)
    for e in tree.entries:
        findings.extend(per_file[e.path])
    findings.extend(res.findings)
    loaders = set(res.loaders)
    for f in facts.values():
        if f.kind in (FileKind.LEGACY_TORCH, FileKind.TORCHSCRIPT):
            loaders.add("torch_load")
    pickles = (*(f.pickle for f in facts.values() if f.pickle is not None), *res.pickles)
    return Inspection(
        format=res.format,
        files=tuple(facts[p] for p in sorted(facts)),
        findings=_ordered(findings),
        loaders=tuple(ld for ld in LOADERS if ld in loaders),
        layout=res.layout,
        pickles=pickles,
        consolidatable=res.consolidatable,
    )


def _detect(tree: SafeTree, facts: dict[str, FileFacts], work: WorkBudget, verify_crc: CrcMode) -> FormatResult:
    """The format of the inspected files; resume state is reported, never part of the model, so the
    format is detected without it."""
    ctx = Context(tree=tree, files={p: f for p, f in facts.items() if f.role != "resume_state"}, work=work)
    try:
        return detect_format(ctx, verify_crc=verify_crc)
    except InputRejected:
        raise
    except Exception as exc:
        return FormatResult(
            format="unknown",
            layout={},
            loaders=(),
            consolidatable=False,
            findings=(error("inspect.detector_failed", "", f"format detection failed: {type(exc).__name__}"),),
        )


class _TensorCount:
    """The tensors read so far across the tree, against :attr:`WalkLimits.max_tensors`.

    Each file's own header is capped (:data:`ckptgate.inspect.safetensors.MAX_TENSORS`); this
    bounds many files together, so the inspection and the policy input stay bounded too.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.total, self._lock = limit, 0, threading.Lock()

    def add(self, facts: FileFacts) -> None:
        n = len(facts.safetensors.tensors) if facts.safetensors is not None else 0
        n += len(facts.torch.tensors) if facts.torch is not None else 0
        with self._lock:
            self.total += n
            if self.total > self.limit:
                raise InputRejected(
                    "input.too_many_tensors",
                    f"the checkpoint's files declare more than {self.limit} tensors together",
                    evidence={"limit": self.limit, "path": facts.path},
                )


def _ordered(findings: list[Finding]) -> tuple[Finding, ...]:
    """Findings without repeats, errors first, then by path and code."""
    uniq: dict[tuple[str, str, str], Finding] = {}
    for f in findings:
        uniq.setdefault((f.code, f.path, f.message), f)
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return tuple(sorted(uniq.values(), key=lambda f: (order[f.severity], f.path, f.code)))


def inspect_tree(root: Path, *, limits: WalkLimits = _DEFAULT_WALK_LIMITS, verify_crc: bool = True) -> Inspection:
    """Walk ``root`` safely and inspect every file; raises ``InputRejected`` only for the whole tree."""
    with SafeTree.open(Path(root), limits) as tree:
        return inspect_open_tree(tree, verify_crc=verify_crc)
