"""Format adapters: each turns an inspected layout into a :class:`ConsolidationPlan`.

Each adapter module registers its :class:`~ckptgate.consolidate.adapters.registry.Adapter` on
import; importing this package imports them all, so the registry's format table is complete.
"""

from ckptgate.consolidate.adapters import (  # registers each
    dcp,
    deepspeed,
    deepspeed_universal,
    fsdp,
    megatron,
    peft,
    safetensors,
)
from ckptgate.consolidate.adapters.registry import Adapter, adapter_for, adapter_name_for, format_table, register

__all__ = [
    "Adapter",
    "adapter_for",
    "adapter_name_for",
    "dcp",
    "deepspeed",
    "deepspeed_universal",
    "format_table",
    "fsdp",
    "megatron",
    "peft",
    "register",
    "safetensors",
]
