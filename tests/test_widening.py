"""What widens the gate: each kind of change is found, and each narrowing is not."""

from __future__ import annotations

import pytest

from ckptgate.widening import Effective, widenings

SIGNER = {"id": "a", "kind": "key", "public_key": "k"}


def eff(**kw: object) -> Effective:
    base: dict = {"trust": {"signers": [SIGNER]}, "intake": {"freshness": {"max_age_seconds": 100,
                  "max_clock_skew_seconds": 10}, "finding_exceptions": []},
                  "gates": {"adapters": {"dcp": {"versions": {"any": False, "exact": ["2.13.0"],
                                                              "ranges": [{"min": "2.10.0", "max_exclusive": "2.12.0"}]}}}}}
    base.update(kw)
    return Effective(**base)


def codes(new: Effective) -> set[str]:
    return {w.code for w in widenings(eff(), new)}


def test_nothing_changed_widens_nothing():
    assert codes(eff()) == set()


@pytest.mark.parametrize(("new", "code"), [
    (eff(trust={"signers": [SIGNER, {"id": "b"}]}), "widening.signer_added"),
    (eff(trust={"signers": [{**SIGNER, "scope": "any"}]}), "widening.signer_changed"),
    (eff(intake={"freshness": {"max_age_seconds": 101, "max_clock_skew_seconds": 10}, "finding_exceptions": []}),
     "widening.freshness_lengthened"),
    (eff(intake={"freshness": {"max_age_seconds": 100, "max_clock_skew_seconds": 11}, "finding_exceptions": []}),
     "widening.freshness_lengthened"),
    (eff(intake={"freshness": {"max_age_seconds": 100, "max_clock_skew_seconds": 10},
                 "finding_exceptions": [{"id": "x", "code": "c"}]}), "widening.exception_added"),
    (eff(gates={"adapters": {"dcp": {"versions": {"any": True, "exact": [], "ranges": []}}}}), "widening.gate_widened"),
    (eff(gates={"adapters": {"dcp": {"versions": {"any": False, "exact": ["2.14.0"], "ranges": []}}}}),
     "widening.gate_widened"),
    (eff(gates={"adapters": {"dcp": {"versions": {"any": False, "exact": [],
                                                  "ranges": [{"min": "2.10.0", "max_exclusive": "2.13.0"}]}}}}),
     "widening.gate_widened"),
    (eff(gates={"adapters": {"new": {"versions": {"any": False, "exact": [], "ranges": []}}}}), "widening.gate_widened"),
    (eff(extra_rego={"deny.rego": b"package ckptgate_consumer\n"}), "widening.extra_rego_changed"),
])
def test_each_widening_is_found(new, code):
    assert code in codes(new)


@pytest.mark.parametrize("new", [
    eff(trust={"signers": []}),
    eff(intake={"freshness": {"max_age_seconds": 5, "max_clock_skew_seconds": 0}, "finding_exceptions": []}),
    eff(gates={"adapters": {"dcp": {"versions": {"any": False, "exact": ["2.13.0", "2.11.4"], "ranges": []}}}}),
    eff(gates={"adapters": {"dcp": {"versions": {"any": False, "exact": [],
                                                 "ranges": [{"min": "2.10.1", "max_exclusive": "2.11.0"}]}}}}),
])
def test_a_narrowing_is_no_widening(new):
    assert codes(new) == set()


def test_extra_rego_is_left_out_at_run_time():
    assert widenings(eff(), eff(extra_rego={"x.rego": b"x"}), include_rego=False) == []


# ------------------------------------------------------------------ review of issue #30: what was missed
@pytest.mark.parametrize("fresh", [
    {"max_age_seconds": 1e12, "max_clock_skew_seconds": 10},  # an integer to jsonschema, not to `int`
    {"max_age_seconds": 100.0, "max_clock_skew_seconds": 10},
    {"max_age_seconds": "100", "max_clock_skew_seconds": 10},
    {"max_age_seconds": 100, "max_clock_skew_seconds": 10, "max_future_seconds": 10},  # a key the base lacks
])
def test_a_freshness_value_that_cannot_be_compared_is_a_widening(fresh):
    new = eff(intake={"freshness": fresh, "finding_exceptions": []})
    assert "widening.freshness_lengthened" in codes(new)


@pytest.mark.parametrize(("intake", "gates", "trust"), [
    ({"exceptable_codes": ["config.auto_map"]}, None, None),
    ({"code_bearing_findings": {"codes": []}}, None, None),
    (None, {"adapters": {"dcp": {"producer": "*", "versions": eff().gates["adapters"]["dcp"]["versions"]}}}, None),
    (None, None, {"require": "nothing"}),
])
def test_policy_data_outside_the_compared_parts_is_a_widening(intake, gates, trust):
    base = eff()
    new = Effective(
        trust={**base.trust, **(trust or {})},
        intake={**base.intake, **(intake or {})},
        gates=gates or base.gates,
    )
    assert "widening.policy_data_changed" in {w.code for w in widenings(base, new)}


def test_a_policy_tree_rego_change_is_a_widening():
    base = eff(policy_files={"ckptgate/intake/intake.rego": b"package ckptgate.intake\n"})
    for rego in ({"ckptgate/intake/intake.rego": b"package ckptgate.intake\n_inspection_clean if true\n"},
                 {}, {"ckptgate/intake/intake.rego": b"package ckptgate.intake\n", "x.rego": b"package x\n"}):
        assert "widening.policy_tree_changed" in {w.code for w in widenings(base, eff(policy_files=rego))}
    assert widenings(base, eff(policy_files=dict(base.policy_files))) == []
    qualified = "ckptgate/config/qualified/data.json"  # generated qualified releases: data the gate passes
    base = eff(policy_files={qualified: b'{"releases": []}'})
    new = eff(policy_files={qualified: b'{"releases": [{"producer": "torch", "version": "9.9.9"}]}'})
    assert {w.code for w in widenings(base, new)} == {"widening.policy_tree_changed"}



def test_extra_rego_removed_is_a_widening():
    """Extra Rego only adds deny reasons: a pull request that deletes a file of it (or the key)
    removes a restriction the base imposed."""
    base = eff(extra_rego={"deny.rego": b"package ckptgate_consumer\n"})
    assert {w.code for w in widenings(base, eff())} == {"widening.extra_rego_changed"}
