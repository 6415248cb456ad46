"""The symbolic values the static pickle reader builds, and their bounded descriptions.

Nothing here is imported or called: a ``Global`` is a name, a ``Call`` is the would-be result
of a call, recorded as data.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "Global", "PersId", "SDict", "SList", "SSet", "Unknown", "key_text", "short"]


@dataclass(frozen=True, slots=True)
class Global:
    module: str
    name: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False, slots=True)
class Call:
    """The would-be result of calling ``func`` (REDUCE, NEWOBJ, NEWOBJ_EX, OBJ, INST)."""

    opcode: str
    func: Any
    args: Any
    kwargs: Any = None
    state: Any = None  # BUILD argument, if any
    dict_items: list[tuple[Any, Any]] | None = None  # SETITEM(S) on an OrderedDict
    list_items: list[Any] | None = None


@dataclass(eq=False, slots=True)
class PersId:
    pid: Any


@dataclass(eq=False, slots=True)
class Unknown:
    reason: str


@dataclass(eq=False, slots=True)
class SList:
    items: list[Any] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class SDict:
    items: list[tuple[Any, Any]] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class SSet:
    items: list[Any] = field(default_factory=list)
    frozen: bool = False


_REPR = reprlib.Repr()  # Python 3.11's takes no keyword arguments
for _k, _v in {
    "maxlevel": 2,
    "maxtuple": 4,
    "maxlist": 4,
    "maxdict": 4,
    "maxset": 4,
    "maxfrozenset": 4,
    "maxstring": 60,
    "maxlong": 40,
    "maxother": 40,
}.items():
    setattr(_REPR, _k, _v)


def short(v: Any) -> str:
    """A short description that costs O(1) whatever ``v`` is (a nested or shared tuple's plain
    repr is as large as the tree it expands to)."""
    r = _REPR.repr(v) if not isinstance(v, (Call, SDict, SList, SSet)) else type(v).__name__
    return r[:80]


def key_text(k: Any) -> str:
    """A dict key as a path component: the string itself, else a bounded repr."""
    if isinstance(k, str):
        return k
    if isinstance(k, bool | float) or k is None or (isinstance(k, int) and k.bit_length() <= 64):
        return repr(k)
    return short(k)
