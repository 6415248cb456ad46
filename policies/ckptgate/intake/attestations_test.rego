# Tests of the attestation requirement (attestations.rego); helpers are in intake_test.rego.
package ckptgate.intake_test

import data.ckptgate.testdata_test as td

test_deny_when_attestation_rejected_even_with_a_trusted_one if {
	_denies("attestation_rejected")
	not "attestation_missing" in _codes(_decide(_deny_cases.attestation_rejected))
}

test_a_rejected_entry_of_any_shape_denies if {
	every entry in [0, "x", [], {}] {
		d := _decide(td.with_value("/rejected_attestations", [entry]))
		d.allow == false
		"attestation_rejected" in _codes(d)
	}
}

test_deny_when_attestation_missing if _denies("attestation_missing")

test_deny_when_attestation_malformed if _denies("attestation_malformed")

test_deny_when_attestation_signed_by_untrusted_key if _denies("attestation_untrusted_signer")

test_deny_when_attestation_for_another_fixture_digest if _denies("attestation_digest_mismatch")

test_deny_when_a_co_subject_would_inherit_another_fixtures_qualification if {
	_denies("attestation_predicate_mismatch")
	not "attestation_digest_mismatch" in _codes(_decide(_deny_cases.attestation_predicate_mismatch))
}

test_deny_when_request_time_unparseable if _denies("attestation_freshness_unchecked")

test_deny_when_attestation_expired if _denies("attestation_expired")

test_deny_when_attestation_not_yet_valid if _denies("attestation_not_yet_valid")

test_deny_when_attestation_for_another_candidate_commit if _denies("attestation_wrong_commit")

test_allow_when_attestation_matches_requested_candidate_commit if {
	_decide(td.with_value("/request/candidate_commit", td.commit)).allow == true
}

test_deny_when_attestation_wrong_predicate_type if _denies("attestation_wrong_predicate_type")

test_deny_when_attestation_adapter_mismatch if _denies("attestation_adapter_mismatch")

test_deny_when_producer_release_unqualified if _denies("producer_release_unqualified")

test_deny_when_topology_unqualified if _denies("topology_unqualified")

test_deny_when_qualification_result_is_not_passed if {
	every status in ["failed", "error", "", null, {"status": "passed"}] {
		d := _decide(td.with_value("/attestations/0/statement/predicate/result/status", status))
		d.allow == false
		"attestation_result_not_passed" in _codes(d)
	}
}

test_deny_when_qualification_result_is_absent if {
	d := _decide(td.patched([{"op": "remove", "path": "/attestations/0/statement/predicate/result"}]))
	d.allow == false
	"attestation_result_not_passed" in _codes(d)
}

test_provenance_needs_no_result if {
	no_result := json.patch(td.pure_data_input, [{"op": "remove", "path": "/attestations/0/statement/predicate/result"}])
	_decide(no_result).allow == true
}

test_deny_when_producer_name_differs_from_gate if {
	d := _decide(td.with_value("/attestations/0/statement/predicate/producer/name", "torch"))
	d.allow == false
	"producer_release_unqualified" in _codes(d)
}

test_allow_pure_data_intake_with_provenance_and_no_containment if {
	d := _decide(td.pure_data_input)
	d.allow == true
	d.plane == "pure_data"
	d.required_controls == []
}

test_deny_pure_data_intake_without_attestation if {
	d := _decide(json.patch(td.pure_data_input, [{"op": "replace", "path": "/attestations", "value": []}]))
	d.allow == false
	_codes(d) & {"attestation_missing"} == {"attestation_missing"}
}

test_allow_pure_data_qualify_without_attestation if {
	d := _decide(json.patch(td.pure_data_input, [
		{"op": "replace", "path": "/attestations", "value": []},
		{"op": "replace", "path": "/request/action", "value": "qualify"},
	]))
	d.allow == true
	d.plane == "pure_data"
}

test_deny_framework_qualify_without_provenance if {
	d := _decide(td.with_value("/request/action", "qualify"))
	d.allow == false
	"attestation_wrong_predicate_type" in _codes(d)
}

test_allow_framework_qualify_with_provenance if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/request/action", "value": "qualify"},
		{"op": "replace", "path": "/attestations/0/statement/predicateType", "value": td.provenance},
	]))
	d.allow == true
}

test_deny_framework_intake_with_provenance_only if {
	d := _decide(td.with_value("/attestations/0/statement/predicateType", td.provenance))
	d.allow == false
	{"attestation_missing", "attestation_wrong_predicate_type"} & _codes(d) == {
		"attestation_missing",
		"attestation_wrong_predicate_type",
	}
}

test_info_attestation_not_used_names_problems if {
	second := json.patch(td.attestation, [{"op": "replace", "path": "/signers/0/spki_sha256", "value": "00"}])
	d := _decide(td.with_value("/attestations", [td.attestation, second]))
	d.allow == true
	some r in d.reasons
	r.code == "attestation_not_used"
	r.evidence == {"attestation": 1, "problems": ["attestation_untrusted_signer"]}
}
