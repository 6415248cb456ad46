"""The topology and step a producer declares in training provenance, validated once for both sides.

``attest checkpoint`` and the hooks refuse to sign what :class:`Topology` or :func:`check_step` refuse
(a usage error), and :func:`~ckptgate.verify.statement.check_statement` refuses an already-signed
statement that carries such values (malformed).  The training-provenance schema states the same ranges
(``definitions.degree``, ``internalParameters.step``); what a schema cannot say is checked here: a value
that is a whole number only as a float, and degrees that the world size cannot hold.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.topology import TOPOLOGY_FIELDS

__all__ = ["MAX_DEGREE", "MAX_STEP", "DeclaredValueError", "Topology", "check_step"]

MAX_DEGREE = 1 << 20
"""The largest parallel degree or world size accepted (the qualification schemas' ``degree`` maximum)."""
MAX_STEP = (1 << 53) - 1
"""The largest step accepted: the largest integer every JSON reader (a float64) carries exactly."""
DEGREES = ("tp", "pp", "dp", "ep", "etp", "cp", "world_size")
"""The parallel degrees: whole numbers from 1 to :data:`MAX_DEGREE`."""
FSDP_MODES = ("full_state_dict", "sharded_state_dict", "local_state_dict")
_PRODUCT = ("tp", "pp", "cp", "dp")
"""The degrees whose product is the world size (Megatron's and DeepSpeed's layout; ep and etp subdivide it)."""


class DeclaredValueError(ValueError):
    """A declared topology field or step that cannot be right; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _whole(value: Any) -> bool:
    return type(value) is int  # not bool, not a float that happens to be whole


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """A declared parallel topology; each field is ``None`` when not declared.  Constructing one validates it."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    etp: int | None = None
    cp: int | None = None
    world_size: int | None = None
    zero_stage: int | None = None
    fsdp_mode: str | None = None

    def __post_init__(self) -> None:
        for name in DEGREES:
            value = getattr(self, name)
            if value is not None and not (_whole(value) and 1 <= value <= MAX_DEGREE):
                raise DeclaredValueError(name, f"{name}={value!r} is not a whole number from 1 to {MAX_DEGREE}")
        if self.zero_stage is not None and not (_whole(self.zero_stage) and 0 <= self.zero_stage <= 3):
            raise DeclaredValueError("zero_stage", f"zero_stage={self.zero_stage!r} is not 0, 1, 2 or 3")
        if self.fsdp_mode is not None and self.fsdp_mode not in FSDP_MODES:
            raise DeclaredValueError("fsdp_mode", f"fsdp_mode={self.fsdp_mode!r} is not one of {', '.join(FSDP_MODES)}")
        world = self.world_size
        if world is None:
            return
        for name in DEGREES:
            value = getattr(self, name)
            if value is not None and world % value:
                raise DeclaredValueError(name, f"{name}={value} does not divide world_size={world}")
        given = {name: getattr(self, name) for name in _PRODUCT if getattr(self, name) is not None}
        product = math.prod(given.values())
        shown = f"{'*'.join(given)} = {'*'.join(map(str, given.values()))}"
        if len(given) == len(_PRODUCT) and product != world:
            raise DeclaredValueError("world_size", f"{shown} is {product} processes, not world_size={world}")
        if world % product:
            raise DeclaredValueError(
                "world_size", f"{shown} is {product} processes, which world_size={world} cannot hold"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Topology:
        """From a statement's or a producer's ``{field: value}``; a key that is no topology field is refused."""
        for key in values:
            if key not in TOPOLOGY_FIELDS:
                raise DeclaredValueError(str(key), f"{key!r} is not a topology field ({', '.join(TOPOLOGY_FIELDS)})")
        return cls(**{k: v for k, v in values.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        """The declared fields, in :data:`~ckptgate.inspect.topology.TOPOLOGY_FIELDS` order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def check_step(step: Any) -> int | None:
    """``step`` when it is ``None`` or a whole number from 0 to :data:`MAX_STEP`."""
    if step is None:
        return None
    if not (_whole(step) and 0 <= step <= MAX_STEP):
        raise DeclaredValueError("step", f"step={step!r} is not a whole number from 0 to {MAX_STEP}")
    return int(step)
