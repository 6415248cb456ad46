"""An overlay's gate versions only narrow the generated, qualified releases: narrowing is never a
widening; dropping a base restriction, or marking an adapter version-independent, is."""

from __future__ import annotations

from typing import Any

from ckptgate.widening import Effective, widenings


def _gates(dcp: dict[str, Any]) -> Effective:
    return Effective(trust={}, intake={}, gates={"adapters": {"dcp": {"producer": "torch", "note": "n", **dcp}}})


NARROW = {"versions": {"any": False, "exact": ["2.13.0"], "ranges": []}}


def test_a_restriction_over_an_unrestricted_gate_is_not_a_widening() -> None:
    assert widenings(_gates({}), _gates(NARROW)) == []
    assert widenings(_gates({}), _gates({"versions": {"any": True, "exact": [], "ranges": []}})) == []


def test_dropping_or_widening_a_restriction_is_a_widening() -> None:
    for new in ({}, {"versions": {"any": False, "exact": ["2.13.0", "2.15.0"], "ranges": []}}):
        [w] = widenings(_gates(NARROW), _gates(new))
        assert w.code == "widening.gate_widened"


def test_marking_an_adapter_version_independent_is_a_widening() -> None:
    [w] = widenings(_gates({}), _gates({"version_independent": {"reason": "r"}}))
    assert w.code == "widening.gate_widened"
    assert widenings(_gates({"version_independent": {"reason": "r"}}), _gates({})) == []
