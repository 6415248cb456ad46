# METADATA
# title: ckptgate.trust_test
# description: Tests for every trust check and the trusted signer matching.
package ckptgate.trust_test

import data.ckptgate.testdata_test as td
import data.ckptgate.trust

_trusted(inp) := ts if {
	ts := trust.trusted_attestations with input as inp with data.ckptgate.config.trust as td.trust
}

_problem_codes(inp) := {r.code |
	rs := trust.reasons with input as inp with data.ckptgate.config.trust as td.trust
	some r in rs
}

_att_with(ops) := td.with_value("/attestations", [json.patch(td.attestation, ops)])

_sigstore_signer := {
	"kind": "sigstore",
	"signer_id": "release-workflow",
	"identity": "https://github.com/example/ckptgate/.github/workflows/qualify.yml@refs/heads/main",
	"issuer": "https://token.actions.githubusercontent.com",
}

test_trusted_when_every_check_passes if {
	_trusted(td.framework_input) == {0}
	_problem_codes(td.framework_input) == set()
}

test_untrusted_when_keyid_hint_matches_but_spki_differs if {
	inp := _att_with([{"op": "replace", "path": "/signers/0/spki_sha256", "value": "00"}])
	_trusted(inp) == set()
	_problem_codes(inp) == {"attestation_untrusted_signer"}
}

test_untrusted_when_algorithm_swapped if {
	inp := _att_with([{"op": "replace", "path": "/signers/0/algorithm", "value": "ecdsa-p256"}])
	_problem_codes(inp) == {"attestation_untrusted_signer"}
}

test_untrusted_when_signer_not_trusted_for_predicate_type if {
	other := "https://example.com/other-predicate/v1"
	inp := _att_with([{"op": "replace", "path": "/statement/predicateType", "value": other}])
	_problem_codes(inp) == {"attestation_untrusted_signer"}
}

test_untrusted_when_producer_outside_signer_scope if {
	inp := _att_with([{"op": "replace", "path": "/signers/0", "value": _sigstore_signer}])
	_problem_codes(inp) == {"attestation_untrusted_signer"}
}

test_trusted_sigstore_identity_within_producer_scope if {
	inp := _att_with([
		{"op": "replace", "path": "/signers/0", "value": _sigstore_signer},
		{"op": "replace", "path": "/statement/predicate/producer", "value": {"name": "torch", "version": "2.13.0"}},
	])
	_trusted(inp) == {0}
}

test_untrusted_when_sigstore_issuer_differs if {
	signer := object.union(_sigstore_signer, {"issuer": "https://accounts.example.com"})
	inp := _att_with([
		{"op": "replace", "path": "/signers/0", "value": signer},
		{"op": "replace", "path": "/statement/predicate/producer", "value": {"name": "torch", "version": "2.13.0"}},
	])
	_problem_codes(inp) == {"attestation_untrusted_signer"}
}

test_untrusted_when_signer_scope_excludes_predicate_kind if {
	scoped := json.patch(td.trust, [{"op": "replace", "path": "/signers/0/scopes", "value": ["provenance"]}])
	ts := trust.trusted_attestations with input as td.framework_input with data.ckptgate.config.trust as scoped
	ts == set()
}

test_untrusted_without_any_signer if {
	inp := _att_with([{"op": "replace", "path": "/signers", "value": []}])
	_problem_codes(inp) == {"attestation_malformed", "attestation_untrusted_signer"}
}

test_malformed_names_each_missing_field if {
	inp := _att_with([
		{"op": "remove", "path": "/statement/predicate/producer"},
		{"op": "replace", "path": "/statement/_type", "value": "https://in-toto.io/Statement/v0.1"},
	])
	rs := trust.reasons with input as inp with data.ckptgate.config.trust as td.trust
	some r in rs
	r.code == "attestation_malformed"
	r.evidence.fields == ["predicate.producer.name", "predicate.producer.version", "statement._type"]
}

test_malformed_when_attestation_is_not_an_object if {
	inp := td.with_value("/attestations", ["not an attestation"])
	"attestation_malformed" in _problem_codes(inp)
	_trusted(inp) == set()
}

test_digest_mismatch_when_subject_names_another_fixture if {
	inp := _att_with([{"op": "replace", "path": "/statement/subject/0/digest/sha256", "value": td.key_spki}])
	_problem_codes(inp) == {"attestation_digest_mismatch"}
}

test_digest_mismatch_when_python_did_not_bind_the_subject if {
	inp := _att_with([{"op": "replace", "path": "/verification/subject_matches_fixture", "value": false}])
	_problem_codes(inp) == {"attestation_digest_mismatch"}
}

test_predicate_mismatch_when_a_co_subject_would_inherit_another_fixtures_predicate if {
	inp := _att_with(td.co_subject_ops(""))
	_problem_codes(inp) == {"attestation_predicate_mismatch"}
	_trusted(inp) == set()
}

test_predicate_mismatch_for_a_provenance_predicate_too if {
	inp := json.patch(td.pure_data_input, td.co_subject_ops("/attestations/0"))
	_problem_codes(inp) == {"attestation_predicate_mismatch"}
}

test_predicate_mismatch_when_predicate_names_another_digest_than_the_bound_subject if {
	# Python's field fact says true, but the predicate's own digest is not the bound subject.
	inp := _att_with([{
		"op": "replace", "path": "/statement/predicate/fixture/digest",
		"value": concat(":", ["sha256", td.key_spki]),
	}])
	"attestation_predicate_mismatch" in _problem_codes(inp)
}

test_predicate_mismatch_when_any_field_python_checked_names_another_fixture if {
	inp := _att_with([{"op": "replace", "path": "/verification/predicate_subject", "value": {
		"fixture.digest": true,
		"fixture.other": false,
	}}])
	_problem_codes(inp) == {"attestation_predicate_mismatch"}
}

test_predicate_mismatch_when_python_checked_no_field if {
	every facts in [{}, null, [true], true] {
		inp := _att_with([{"op": "replace", "path": "/verification/predicate_subject", "value": facts}])
		_problem_codes(inp) == {"attestation_predicate_mismatch"}
	}
}

test_predicate_and_digest_mismatch_without_the_bound_subject_fact if {
	inp := _att_with([{"op": "remove", "path": "/verification/subject_digest"}])
	_problem_codes(inp) == {"attestation_digest_mismatch", "attestation_predicate_mismatch"}
}

test_digest_mismatch_when_the_bound_subject_is_not_the_request_fixture if {
	other := concat(":", ["sha256", td.key_spki])
	inp := _att_with([
		{"op": "replace", "path": "/verification/subject_digest", "value": other},
		{"op": "replace", "path": "/statement/predicate/fixture/digest", "value": other},
	])
	_problem_codes(inp) == {"attestation_digest_mismatch"}
}

test_trusted_with_a_co_subject_when_the_predicate_is_about_the_bound_one if {
	inp := _att_with([{"op": "add", "path": "/statement/subject/-", "value": {
		"name": "other",
		"digest": {"sha256": td.key_spki},
	}}])
	_trusted(inp) == {0}
}

test_foreign_predicate_types_are_not_bound_by_ckptgate_fields if {
	inp := _att_with([
		{"op": "replace", "path": "/statement/predicateType", "value": "https://slsa.dev/provenance/v1"},
		{"op": "replace", "path": "/verification/predicate_subject", "value": {}},
	])
	not "attestation_predicate_mismatch" in _problem_codes(inp)
}

test_digest_mismatch_when_fixture_digest_missing if {
	inp := json.patch(td.framework_input, [{"op": "remove", "path": "/fixture"}])
	_problem_codes(inp) == {"attestation_digest_mismatch"}
}

test_expired_after_expires_at if {
	_problem_codes(td.with_value("/request/now", "2027-11-01T00:00:00Z")) == {"attestation_expired"}
}

test_expired_when_older_than_max_age if {
	inp := _att_with([{"op": "replace", "path": "/statement/predicate/validity", "value": {
		"issued_at": "2025-01-01T00:00:00Z",
		"expires_at": "2030-01-01T00:00:00Z",
	}}])
	_problem_codes(inp) == {"attestation_expired"}
}

test_not_yet_valid_beyond_clock_skew if {
	_problem_codes(td.with_value("/request/now", "2026-10-31T23:54:59Z")) == {"attestation_not_yet_valid"}
}

test_valid_within_clock_skew if {
	_problem_codes(td.with_value("/request/now", "2026-10-31T23:55:00Z")) == set()
}

test_freshness_unchecked_without_request_time if {
	inp := json.patch(td.framework_input, [{"op": "remove", "path": "/request/now"}])
	_problem_codes(inp) == {"attestation_freshness_unchecked"}
	_trusted(inp) == set()
}

test_wrong_commit_when_request_binds_another_commit if {
	inp := td.with_value("/request/candidate_commit", "2222222222222222222222222222222222222222")
	_problem_codes(inp) == {"attestation_wrong_commit"}
}

test_no_commit_binding_when_request_names_none if {
	inp := _att_with([{"op": "remove", "path": "/statement/predicate/candidate_commit"}])
	_trusted(inp) == {0}
}

test_wrong_commit_when_attestation_names_no_commit_but_request_does if {
	inp := json.patch(td.framework_input, [
		{"op": "remove", "path": "/attestations/0/statement/predicate/candidate_commit"},
		{"op": "replace", "path": "/request/candidate_commit", "value": td.commit},
	])
	_problem_codes(inp) == {"attestation_wrong_commit"}
}

test_reason_messages_name_the_source_and_evidence if {
	rs := trust.reasons with input as td.with_value("/request/now", "2027-11-02T00:00:00Z")
		with data.ckptgate.config.trust as td.trust
	some r in rs
	r.code == "attestation_expired"
	contains(r.message, "attestations/sha256-aaaa.intoto.json (index 0)")
	contains(r.message, "2027-11-01T00:00:00Z")
	r.evidence.attestation == 0
}

test_time_ns_is_null_for_non_times if {
	trust.time_ns("2026-11-29T17:00:00Z") == 1795971600000000000
	trust.time_ns("not a time") == null
	trust.time_ns(42) == null
}

test_freshness_unchecked_when_intake_data_lacks_freshness if {
	inp := td.framework_input
	ts := trust.trusted_attestations with input as inp
		with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.intake.freshness as null
	ts == set()
	rs := trust.reasons with input as inp
		with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.intake.freshness as null
	{r.code | some r in rs} == {"attestation_freshness_unchecked"}
}

test_malformed_when_statement_types_data_missing if {
	rs := trust.reasons with input as td.framework_input
		with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.intake.statement_types as null
	{r.code | some r in rs} == {"attestation_malformed"}
}

test_unchecked_when_checks_cannot_be_evaluated if {
	ctx := {"bind_fixture": true, "fixture_digest": null, "now_ns": 0, "candidate_commit": null}
	ps := trust.problems(0, td.attestation, ctx, {"signers": []})
	{p.code | some p in ps} == {"attestation_unchecked"}
}
