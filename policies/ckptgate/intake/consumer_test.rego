# Tests of the consumer deny, for ckptgate.intake: a consumer's data.ckptgate_consumer.deny only adds
# deny reasons. Each element denies with "consumer.<code>" and refusal class policy; a malformed
# element or a deny that is not a set denies too; none, or an empty set, leaves the decision as it was.
package ckptgate.intake_test

import data.ckptgate.intake
import data.ckptgate.testdata_test as td

_consumer_decide(inp, consumer) := d if {
	d := intake.decision with input as inp
		with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.qualified as td.qualified
		with data.ckptgate_consumer.deny as consumer
}

_consumer_deny_codes(d) := {r.code | some r in d.reasons; r.severity == "deny"}

_consumer_no_fridays := {"code": "no_fridays", "message": "no intake on a Friday"}

test_without_consumer_rules_the_decision_is_unchanged if {
	d := intake.decision with input as td.framework_input with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.qualified as td.qualified
	d.allow == true
	_consumer_decide(td.framework_input, set()) == d
}

test_a_consumer_deny_denies_an_allowed_intake_with_class_policy if {
	d := _consumer_decide(td.framework_input, {_consumer_no_fridays})
	d.allow == false
	d.refusal == "policy"
	d.permitted_loaders == []
	_consumer_deny_codes(d) == {"consumer.no_fridays"}
	some r in d.reasons
	r == {"code": "consumer.no_fridays", "message": "no intake on a Friday", "evidence": {}, "severity": "deny"}
}

test_a_consumer_deny_keeps_its_evidence if {
	element := object.union(_consumer_no_fridays, {"evidence": {"day": "friday"}})
	some r in _consumer_decide(td.framework_input, {element}).reasons
	r.code == "consumer.no_fridays"
	r.evidence == {"day": "friday"}
}

test_a_consumer_deny_beside_a_verification_failure_is_policy if {
	inp := td.with_value("/fixture/digest", concat(":", ["sha256", td.key_spki]))
	_consumer_decide(inp, set()).refusal == "verification"
	_consumer_decide(inp, {_consumer_no_fridays}).refusal == "policy"
}

test_a_consumer_deny_beside_an_input_refusal_stays_input if {
	d := _consumer_decide(td.with_value("/inspection/clean", false), {_consumer_no_fridays})
	d.refusal == "input"
	"consumer.no_fridays" in _consumer_deny_codes(d)
}

_consumer_malformed_elements := [
	"no_fridays",
	{"code": "no_fridays"},
	{"message": "m"},
	{"code": "", "message": "m"},
	{"code": "No_Fridays", "message": "m"},
	{"code": "no fridays", "message": "m"},
	{"code": ".x", "message": "m"},
	{"code": sprintf("a%055d", [0]), "message": "m"},
	{"code": 7, "message": "m"},
	{"code": "x", "message": 7},
	{"code": "x", "message": "m", "severity": "info"},
	{"code": "x", "message": "m", "evidence": "e"},
]

test_a_malformed_element_is_a_deny if {
	every element in _consumer_malformed_elements {
		d := _consumer_decide(td.framework_input, {element})
		d.allow == false
		d.refusal == "policy"
		_consumer_deny_codes(d) == {"consumer.malformed"}
	}
}

test_the_longest_code_fits_a_reason_code if {
	code := sprintf("a%054d", [0])
	d := _consumer_decide(td.framework_input, {{"code": code, "message": "m"}})
	_consumer_deny_codes(d) == {concat(".", ["consumer", code])}
}

test_a_malformed_element_does_not_hide_a_good_one if {
	d := _consumer_decide(td.framework_input, {_consumer_no_fridays, "x"})
	_consumer_deny_codes(d) == {"consumer.no_fridays", "consumer.malformed"}
}

test_a_deny_that_is_not_a_set_is_a_deny if {
	every value in [[_consumer_no_fridays], {"no_fridays": _consumer_no_fridays}, true, false, null, "deny", 0, []] {
		d := _consumer_decide(td.framework_input, value)
		d.allow == false
		_consumer_deny_codes(d) == {"consumer.malformed"}
	}
}

test_the_precheck_does_not_read_the_consumer_deny if {
	p := intake.precheck with input as td.framework_input with data.ckptgate_consumer.deny as {_consumer_no_fridays}
	p.refuse == false
}
