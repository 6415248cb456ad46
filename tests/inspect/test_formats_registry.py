"""The detector registry: the built-in detection order, and a total order with no ties."""

from __future__ import annotations

import pytest

from ckptgate.inspect.formats import registry


def test_builtin_detectors_run_in_the_documented_order() -> None:
    assert [d.name for d in registry.detectors()] == [
        "hf-sharded-safetensors", "peft", "megatron-torch-dist", "dcp-torch-save", "dcp-folders",
        "dcp-hf-safetensors", "deepspeed-universal", "deepspeed-zero", "fsdp", "safetensors"]
    assert [d.name for d in registry.detectors() if d.takes_crc] == [
        "megatron-torch-dist", "dcp-torch-save", "dcp-folders"]


@pytest.mark.parametrize("name, order", [("fsdp", 5), ("another", 80)])
def test_a_taken_name_or_order_is_refused(name: str, order: int) -> None:
    before = registry.detectors()
    with pytest.raises(ValueError):
        registry.register_detector(name, lambda ctx: None, formats=("x",), order=order)
    assert registry.detectors() == before
