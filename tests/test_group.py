"""The group interface the intake's steps run over: a world of one, and the abort every world shares."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ckptgate.errors import Error, ExitCode, RuntimeFailure, UsageError
from ckptgate.group import Group, LocalGroup, Relayed


def test_a_world_of_one_gathers_its_own_result_as_canonical_json() -> None:
    g = LocalGroup()
    assert (g.rank, g.world) == (0, 1)
    assert g.agree("digest", lambda: {"b": (1, 2), "a": "é"}) == [{"b": [1, 2], "a": "é"}]  # tuples become lists
    assert g.broadcast("decide", lambda: {"allow": True}) == {"allow": True}


def test_a_world_of_one_raises_its_own_failure_unchanged() -> None:
    with pytest.raises(UsageError) as e:
        LocalGroup().agree("inspect", lambda: (_ for _ in ()).throw(UsageError("usage.x", "bad")))
    assert e.value.code == "usage.x"


def test_a_world_of_one_raises_an_os_error_and_a_bug_as_one_process_does() -> None:
    """Nobody to tell: the caller's handlers see the exception itself (the CLI's runtime.io advice)."""
    def io() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as e:
        LocalGroup().agree("write", io)
    assert e.value.errno == 28
    with pytest.raises(ZeroDivisionError):
        LocalGroup().agree("write", lambda: 1 // 0)


class _Peers(Group):
    """Rank ``rank`` of a world whose other ranks answer ``others`` (rank order, this rank's slot left out)."""

    def __init__(self, rank: int, others: list[Any]) -> None:
        self.rank, self.world, self.others = rank, len(others) + 1, others

    def exchange(self, phase: str, data: Any) -> list[Any]:
        out = list(self.others)
        out.insert(self.rank, data)
        return out


def test_above_a_world_of_one_an_os_error_and_a_bug_become_typed_errors() -> None:
    """The other ranks must hear of them, not wait for the deadline."""
    def io() -> None:
        raise OSError(28, "No space left on device")

    alive = [{"ok": True, "data": None}]
    with pytest.raises(RuntimeFailure) as e:
        _Peers(0, alive).agree("write", io)
    assert e.value.code == "runtime.io"
    with pytest.raises(Error) as bug:
        _Peers(0, alive).agree("write", lambda: 1 // 0)
    assert bug.value.code == "internal.unexpected"


def test_every_rank_raises_the_lowest_failing_ranks_code_and_exit_code() -> None:
    fail = {"ok": False, "error": {"code": "policy.denied", "exit": int(ExitCode.DENIED), "message": "no"}}
    other = {"ok": False, "error": {"code": "runtime.io", "exit": int(ExitCode.RUNTIME_FAILED), "message": "disk"}}
    with pytest.raises(Relayed) as e:
        _Peers(2, [fail, other]).agree("decide", lambda: {"x": 1})
    assert (e.value.code, e.value.exit_code, e.value.evidence) == ("policy.denied", ExitCode.DENIED, {"rank": 0})
    assert _Peers(1, [{"ok": True, "data": 5}]).agree("digest", lambda: 6) == [5, 6]
    assert _Peers(1, [{"ok": True, "data": "rank0"}]).broadcast("decide", lambda: "not asked") == "rank0"


def test_the_group_module_imports_no_torch() -> None:
    code = "import sys, ckptgate.group; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
