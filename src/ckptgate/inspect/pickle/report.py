"""What the static pickle reader reports for one stream, and the caps that bound it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptgate.inspect.findings import Finding

__all__ = ["CallSite", "PickleLimits", "PickleReport", "looks_like_pickle"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PickleLimits:
    """Caps that bound the reader's time and memory."""

    max_bytes: int = 512 << 20
    max_ops: int = 50_000_000
    max_memo: int = 10_000_000
    max_stack: int = 1_000_000
    max_frame: int = 1 << 26  # 64 MiB, far above what the pickler writes (64 KiB)
    max_blob: int = 1 << 30
    max_depth: int = 200  # nesting of the reconstructed value (the planners recurse)
    #: widest integer constant kept: LONG1 holds up to 2040 bits, so only LONG4 (and decimal text)
    #: can exceed it.  A wider one would reach an f-string, a repr or the JSON report, where Python
    #: refuses to print an int of more than 4300 digits (a ValueError, not a finding).
    max_int_bits: int = 2048

    def __post_init__(self) -> None:
        for k in (
            "max_bytes",
            "max_ops",
            "max_memo",
            "max_stack",
            "max_frame",
            "max_blob",
            "max_depth",
            "max_int_bits",
        ):
            if getattr(self, k) <= 0:
                raise ValueError(f"PickleLimits.{k} must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSite:
    opcode: str
    target: str  # dotted global, or "<unresolved>"
    pos: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PickleReport:
    """What the reader found in one pickle stream."""

    path: str
    context: str
    protocol: int | None
    complete: bool  # reached STOP with a well-formed stream
    opcodes: dict[str, int]
    globals: tuple[str, ...]
    calls: tuple[CallSite, ...]
    findings: tuple[Finding, ...]
    inside_allowlist: bool  # every global and call inside the context's allowlist, nothing unresolved
    plain_tensors: bool  # ... and inside the plain-tensor allowlist
    value: Any = field(default=None, repr=False, compare=False)  # symbolic root value (not serialised)
    #: the argument of every PERSID/BINPERSID read, in order, wherever it ends up (not serialised):
    #: an unpickler calls ``persistent_load`` on each as it reads it, reachable from the root or not
    persistent_ids: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    work: int = field(default=0, compare=False)  # work units spent reading (and measuring) it (budget.py)
    #: ``value`` seen as a tree: nodes plus 64-byte blocks of its expanded strings and key paths.
    #: Measured (and charged) before ``value`` is kept; every walk of ``value`` is bounded by it.
    tree_units: int = field(default=0, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "protocol": self.protocol,
            "complete": self.complete,
            "opcodes": dict(sorted(self.opcodes.items())),
            "globals": list(self.globals),
            "calls": [{"opcode": c.opcode, "target": c.target, "pos": c.pos} for c in self.calls],
            "inside_allowlist": self.inside_allowlist,
            "plain_tensors": self.plain_tensors,
        }


def looks_like_pickle(b: bytes) -> bool:
    """A protocol 2-5 header (``\\x80`` + protocol) followed by a plausible opcode."""
    return len(b) >= 3 and b[0] == 0x80 and 2 <= b[1] <= 5 and b[2] in b"\x95}]()cq\x8c\x8aX"
