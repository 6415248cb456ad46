"""The group an intake runs in: its ranks, and the few exchanges the steps need between them.

One intake is one sequence of steps (inspect, digest, verify, decide, enforce, consolidate,
publish).  Where ranks must agree, a step asks its :class:`Group`, never torch: a world of one
(:class:`LocalGroup`: no torch import, no process group) serves the single process, and
:class:`ckptgate.distributed.TorchGroup` (HMAC-bound messages over ``all_gather``) serves
``--distributed``.  A transport implements only :meth:`Group.exchange` (an all-gather of canonical
JSON bytes); what the steps use is written here once:

* :meth:`Group.agree` runs one rank's share of a step and gathers every rank's result; if any
  rank failed, *every* rank raises the first failure (the lowest failing rank's code and exit code:
  the abort);
* :meth:`Group.broadcast` is the same with only rank 0 producing (the decision, the stage's name).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ckptgate import interrupts
from ckptgate.errors import Error, ExitCode, RuntimeFailure

__all__ = ["Group", "LocalGroup", "Relayed", "canonical"]


def canonical(data: Any) -> bytes:
    """The bytes a message is sent as: compact JSON, keys in the order they were made (a worker
    tree's object order carries meaning: ZeRO's ``param_shapes`` order is its partitions' layout)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


class Relayed(Error):
    """Another rank's failure, relayed: its code and exit code, with the failing rank in evidence."""

    def __init__(self, code: str, message: str, *, exit_code: int, rank: int) -> None:
        super().__init__(
            code,
            message,
            evidence={"rank": rank},
            advice="See the failing rank's own error output; nothing was published.",
        )
        self.exit_code = ExitCode(exit_code)


def _failure(e: Error) -> dict[str, Any]:
    return {"ok": False, "error": {"code": e.code, "exit": int(e.exit_code), "message": e.message}}


def _as_error(e: Exception, rank: int) -> Error:
    """This rank's OSError or bug, as the error the other ranks are told of (not to wait for the deadline)."""
    if isinstance(e, OSError):
        return RuntimeFailure("runtime.io", f"rank {rank}: {e.strerror or e}", evidence={"errno": e.errno})
    return Error("internal.unexpected", f"rank {rank}: {type(e).__name__}: {e}")


class Group:
    """The ranks of one intake.  Subclasses implement :meth:`exchange`; :meth:`agree` and
    :meth:`broadcast` (and so the abort) are the same for every world size."""

    rank: int = 0
    world: int = 1

    def exchange(self, phase: str, data: Any) -> list[Any]:
        """Every rank's ``data`` (JSON), in rank order, as each rank sent it (:func:`canonical`)."""
        raise NotImplementedError

    def bind_fixture(self, digest: str) -> None:
        """From now on every message is bound to the fixture digest the ranks formed."""

    def agree(self, phase: str, produce: Callable[[], Any]) -> list[Any]:
        """Run ``produce`` on this rank and gather every rank's result; if any rank failed, every
        rank raises the first failure (the lowest failing rank's)."""
        own: Error | None = None
        stopped: interrupts.Interrupted | None = None
        try:
            msg = {"ok": True, "data": produce()}
        except interrupts.Interrupted as e:  # this rank was stopped: tell the others, then unwind
            stopped = e
            msg = _failure(e.error())
        except Error as e:
            own, msg = e, _failure(e)
        except Exception as e:
            if self.world == 1:  # nobody to tell: raised as one process raises it
                raise
            own = _as_error(e, self.rank)
            msg = _failure(own)
        msgs = self.exchange(phase, msg)
        if stopped is not None:
            raise stopped
        failed = [(r, m["error"]) for r, m in enumerate(msgs) if not m.get("ok")]
        if failed:
            r, err = failed[0]
            if own is not None and r == self.rank:
                raise own
            raise Relayed(
                str(err["code"]),
                f"rank {r} failed in the {phase} step: {err['message']}",
                exit_code=int(err["exit"]),
                rank=r,
            )
        return [m["data"] for m in msgs]

    def broadcast(self, phase: str, produce: Callable[[], Any]) -> Any:
        """Rank 0's ``produce()``, on every rank (the other ranks only report that they are alive)."""
        return self.agree(phase, produce if self.rank == 0 else lambda: None)[0]


class LocalGroup(Group):
    """A world of one: the single process.  Its messages still pass through :func:`canonical`, so a
    step sees the same JSON at world 1 as at world N."""

    def exchange(self, phase: str, data: Any) -> list[Any]:
        return [json.loads(canonical(data))]
