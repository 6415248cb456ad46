"""Work budgets: the work to read, or to refuse, any input is bounded by its bytes.

A *work unit* is one pickle opcode decoded, one edge of the reconstructed object graph measured,
or one node (or 64 bytes of expanded strings) of that graph seen as a tree.  Two budgets bound
them, and a refusal names the one it exceeded:

* per file: each pickle stream (a raw pickle, a torch zip's ``data.pkl``, a DCP storage item)
  may use ``file_base + file_per_byte * len(stream)`` units.  Exceeding it is an error finding,
  ``inspect.work_budget`` with ``budget: "file"``, and the stream's value is dropped, so no
  later walk sees it.  A stream refused so is charged its whole budget.
* the whole intake: every file and thread together may use ``intake_base + intake_per_byte *
  total bytes of the tree``.  Exceeding it refuses the whole tree, :class:`InputRejected`
  ``input.work_budget`` with ``budget: "intake"``: many small hostile files cannot each spend
  their own constant.

Every walk of a reconstructed value is bounded by the tree size measured (and charged) when the
stream was read: see :func:`ckptgate.inspect.pickle.read_pickle`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ckptgate.errors import InputRejected
from ckptgate.inspect.findings import Finding, error

__all__ = ["FileWork", "WorkBudget", "WorkLimits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkLimits:
    """The work budgets, in units (see the module docstring)."""

    file_base: int = 8_192
    file_per_byte: int = 8  # clean real pickles use 0.5-2 units per byte
    intake_base: int = 16_384  # under three files' constants: hostile files cannot each spend theirs
    intake_per_byte: int = 8

    def __post_init__(self) -> None:
        for k in ("file_base", "file_per_byte", "intake_base", "intake_per_byte"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"WorkLimits.{k} must be a positive int")

    def file_limit(self, nbytes: int) -> int:
        return self.file_base + self.file_per_byte * max(0, nbytes)

    def intake_limit(self, nbytes: int) -> int:
        return self.intake_base + self.intake_per_byte * max(0, nbytes)


class WorkBudget:
    """The whole intake's budget, shared by every file and thread (like the tensor count)."""

    def __init__(self, limits: WorkLimits, total_bytes: int) -> None:
        self.limits = limits
        self.limit = limits.intake_limit(total_bytes)
        self.used = 0
        self._lock = threading.Lock()

    def charge(self, n: int, path: str) -> None:
        """Add ``n`` units; raises ``InputRejected`` (``budget: "intake"``) past the limit."""
        with self._lock:
            self.used += n
            used = self.used
        if used > self.limit:
            raise InputRejected(
                "input.work_budget",
                f"inspecting the checkpoint needs more than its whole-intake work budget of "
                f"{self.limit} units ({self.limits.intake_base} + {self.limits.intake_per_byte} "
                "per byte of the tree)",
                evidence={"budget": "intake", "limit": self.limit, "used": used, "path": path},
                advice=f"A pickle (the budget ran out in {path}) expands far beyond its bytes (memo expansion, "
                "deep nesting, repeated strings). Nothing was loaded. If the checkpoint is "
                "genuine, raise WorkLimits.intake_base or intake_per_byte.",
            )

    def file(self, path: str, nbytes: int) -> FileWork:
        return FileWork(path, nbytes, self.limits, self)


class FileWork:
    """One pickle stream's budget; every unit is charged to the intake's budget too."""

    __slots__ = ("done", "intake", "limit", "path", "used")

    def __init__(
        self, path: str, nbytes: int, limits: WorkLimits = WorkLimits(), intake: WorkBudget | None = None
    ) -> None:
        self.path, self.intake = path, intake
        self.limit = limits.file_limit(nbytes)
        self.used = 0  # charged, to this budget and the intake's
        self.done = 0  # of which work actually done (a refusal charges the rest without doing it)

    def remaining(self) -> int:
        return self.limit - self.used

    def charge(self, n: int) -> bool:
        """Add ``n`` units of work done; False once past the file's limit.  Raises past the intake's."""
        self.done += n
        return self._add(n)

    def exhaust(self) -> None:
        """Charge what is left, and one more: a stream refused for its budget has spent it."""
        self._add(max(0, self.remaining()) + 1)

    def _add(self, n: int) -> bool:
        self.used += n
        if self.intake is not None:
            self.intake.charge(n, self.path)
        return self.used <= self.limit

    def refusal(self, what: str, *, at_least: int | None = None) -> Finding:
        ev: dict[str, object] = {"budget": "file", "limit": self.limit, "used": self.done}
        if at_least is not None:
            ev["needs_at_least"] = at_least
        return error(
            "inspect.work_budget",
            self.path,
            f"{what} needs more than the per-file work budget of "
            f"{self.limit} units (a constant plus a multiple of the stream's bytes); refused unread",
            **ev,
        )
