"""The detector registry: every format detector, in detection order; the first match wins.

Each detector module registers its detectors when it is imported (:mod:`ckptgate.inspect.formats`
imports them all) with an ``order``: a lower order runs first.  The order matters where layouts
overlap (an HF index before a single safetensors file, PEFT before plain safetensors, DCP before
FSDP), so a new detector picks its order against the built-in ones listed in
``docs/consolidation.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.zipcheck import CrcMode

__all__ = ["Detector", "DetectorFn", "detectors", "register_detector", "unregister_detector"]

#: ``detect(ctx, verify_crc=...)``: a typed layout, or ``None`` when the tree is not this format.
DetectorFn = Callable[..., "FormatResult | None"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Detector:
    """One registered detector: ``name`` (unique), the ``formats`` it can report, its ``order``."""

    name: str
    formats: tuple[str, ...]
    order: int
    detect: DetectorFn
    #: whether ``detect`` takes ``verify_crc`` (detectors that read zip members do)
    takes_crc: bool = False

    def __call__(self, ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult | None:
        return self.detect(ctx, verify_crc=verify_crc) if self.takes_crc else self.detect(ctx)


_DETECTORS: dict[str, Detector] = {}


def register_detector(
    name: str, detect: DetectorFn, *, formats: tuple[str, ...], order: int, takes_crc: bool = False
) -> Detector:
    """Add a detector; its name and its order must be new (the order is total, never a tie)."""
    if name in _DETECTORS:
        raise ValueError(f"detector {name!r} is already registered")
    clash = [d.name for d in _DETECTORS.values() if d.order == order]
    if clash:
        raise ValueError(f"detector {name!r}: order {order} is taken by {clash[0]!r}")
    d = Detector(name=name, formats=tuple(formats), order=order, detect=detect, takes_crc=takes_crc)
    _DETECTORS[name] = d
    return d


def unregister_detector(name: str) -> None:
    """Remove the detector named ``name`` (a test's cleanup)."""
    del _DETECTORS[name]


def detectors() -> tuple[Detector, ...]:
    """Every registered detector, in detection order."""
    return tuple(sorted(_DETECTORS.values(), key=lambda d: d.order))
