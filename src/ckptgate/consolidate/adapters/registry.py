"""The adapter registry: one :class:`Adapter` per adapter name, each planning the formats it names.

This is the one table from inspected format to adapter.  Each adapter module registers its
adapters when it is imported (:mod:`ckptgate.consolidate.adapters` imports them all), and
``tests/consolidate/test_registry.py`` checks the table against the ``formats`` and ``adapters``
of ``policies/ckptgate/config/gates/data.json``.  Adding a format is a detector
(:mod:`ckptgate.inspect.formats.registry`), an adapter registered here, and a data row; see
``docs/consolidation.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ckptgate.consolidate.plan import ConsolidationPlan

if TYPE_CHECKING:
    from ckptgate.decide.decision import Selection
    from ckptgate.enforce.load import LoadedTrees
    from ckptgate.inspect import Inspection

__all__ = [
    "Adapter",
    "Planner",
    "RegistryError",
    "Static",
    "StaticAdapter",
    "adapter_for",
    "adapter_name_for",
    "adapters",
    "format_table",
    "register",
    "unregister",
]


@runtime_checkable
class Adapter(Protocol):
    """What consolidation asks of a format adapter.

    ``loaded`` is the enforce step's record of the trees the contained worker loaded from
    :meth:`framework_files` (:class:`ckptgate.enforce.load.LoadedTrees`); it is ``None`` when
    :meth:`framework_files` returned ``()`` and no worker ran.
    """

    @property
    def name(self) -> str:
        """The adapter name the gates data (``policies/ckptgate/config/gates/data.json``) uses."""
        ...

    @property
    def formats(self) -> tuple[str, ...]:
        """The inspection formats this adapter plans."""
        ...

    @property
    def mappings(self) -> tuple[str, ...]:
        """Declared mapping adapters it accepts (``plan(..., mapping=...)``); ``()`` when none."""
        ...

    @property
    def selects(self) -> bool:
        """Whether it can write only a subtree the decision selects (``plan(..., selection=...)``)."""
        ...

    def framework_files(self, inspection: Inspection) -> tuple[str, ...]:
        """The files a framework loader must read in the contained worker; ``()`` when the plan
        needs only what inspection read (pure data or the static reader)."""
        ...

    def plan(
        self,
        inspection: Inspection,
        *,
        max_shard_bytes: int,
        mapping: str | None = None,
        selection: Selection | None = None,
        loaded: LoadedTrees | None = None,
    ) -> ConsolidationPlan:
        """The plan for an inspected, consolidatable checkpoint of one of :attr:`formats`."""
        ...


class StaticAdapter:
    """A base for adapters that plan from what inspection read: no framework load, no mapping."""

    name: str
    formats: tuple[str, ...]
    mappings: tuple[str, ...] = ()
    selects: bool = False

    def framework_files(self, inspection: Inspection) -> tuple[str, ...]:
        return ()


#: ``(inspection, max_shard_bytes, mapping, selection) -> plan``: what a :class:`Static` adapter runs.
Planner = Callable[["Inspection", int, "str | None", "Selection | None"], ConsolidationPlan]


@dataclass(frozen=True, slots=True)
class Static(StaticAdapter):
    """An adapter that plans from what inspection read with ``planner``: the block every static
    adapter would otherwise repeat (its ``plan`` method), written once."""

    name: str
    formats: tuple[str, ...]
    planner: Planner
    mappings: tuple[str, ...] = ()
    selects: bool = False

    def plan(
        self,
        inspection: Inspection,
        *,
        max_shard_bytes: int,
        mapping: str | None = None,
        selection: Selection | None = None,
        loaded: LoadedTrees | None = None,
    ) -> ConsolidationPlan:
        return self.planner(inspection, max_shard_bytes, mapping, selection)


class RegistryError(ValueError):
    """A registration that would make the format table ambiguous (a programming error, not input)."""


_BY_NAME: dict[str, Adapter] = {}
_BY_FORMAT: dict[str, str] = {}


def register(adapter: Adapter) -> Adapter:
    """Add ``adapter``; its name and each of its formats must be new.  Returns it."""
    if adapter.name in _BY_NAME:
        raise RegistryError(f"adapter {adapter.name!r} is already registered")
    taken = {f: _BY_FORMAT[f] for f in adapter.formats if f in _BY_FORMAT}
    if taken:
        raise RegistryError(f"adapter {adapter.name!r}: formats already planned by another adapter: {taken}")
    if not adapter.formats:
        raise RegistryError(f"adapter {adapter.name!r} plans no format")
    _BY_NAME[adapter.name] = adapter
    for f in adapter.formats:
        _BY_FORMAT[f] = adapter.name
    return adapter


def unregister(name: str) -> None:
    """Remove the adapter named ``name`` and its formats (a test's cleanup)."""
    adapter = _BY_NAME.pop(name)
    for f in adapter.formats:
        _BY_FORMAT.pop(f, None)


def adapter_for(fmt: str | None) -> Adapter | None:
    """The adapter that plans inspected format ``fmt``, or None."""
    name = _BY_FORMAT.get(fmt) if fmt is not None else None
    return _BY_NAME[name] if name is not None else None


def adapter_name_for(fmt: str | None) -> str | None:
    """The name of the adapter that plans ``fmt`` (the gates data's ``formats.<fmt>.adapter``), or None."""
    return _BY_FORMAT.get(fmt) if fmt is not None else None


def adapters() -> Mapping[str, Adapter]:
    """Every registered adapter, by name."""
    return MappingProxyType(dict(_BY_NAME))


def format_table() -> Mapping[str, str]:
    """``{format: adapter name}`` for every format some adapter plans."""
    return MappingProxyType(dict(sorted(_BY_FORMAT.items())))
