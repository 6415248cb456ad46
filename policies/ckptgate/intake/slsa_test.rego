# Tests of SLSA provenance v1 statements whose subjects Python bound file by file to the measured
# manifest (helpers are in intake_test.rego). A key in trust data scoped to slsa_provenance and to
# the statement's builder id satisfies the pure-data and static-pickle planes, never the framework
# plane; subjects beyond the checkpoint count against max_extra_subjects.
package ckptgate.intake_test

import data.ckptgate.intake
import data.ckptgate.testdata_test as td
import data.ckptgate.trust

_slsa_type := "https://slsa.dev/provenance/v1"

_builder := "https://github.com/example/trainer/.github/workflows/train.yml@refs/heads/main"

_slsa_trust := {"signers": [{
	"id": "release-builder",
	"kind": "key",
	"algorithm": "ed25519",
	"public_key": "-----BEGIN PUBLIC KEY-----\ntest\n-----END PUBLIC KEY-----\n",
	"spki_sha256": td.key_spki,
	"predicate_types": [_slsa_type],
	"producers": [_builder],
	"scopes": ["slsa_provenance"],
}]}

_slsa_signer := json.patch(td.key_signer, [{"op": "replace", "path": "/signer_id", "value": "release-builder"}])

_slsa_attestation := {
	"source": "slsa.json",
	"statement": {
		"_type": "https://in-toto.io/Statement/v1",
		"subject": [{"name": "model.safetensors", "digest": {"sha256": td.key_spki}}],
		"predicateType": _slsa_type,
		"predicate": {
			"buildDefinition": {"buildType": "https://example.com/trainer/v1", "externalParameters": {}},
			"runDetails": {"builder": {"id": _builder}},
		},
	},
	"signers": [_slsa_signer],
	"verification": {
		"method": "dsse",
		"checks": ["envelope", "payload_type", "signature", "statement_schema", "subjects_bound_to_files"],
		"verified_at": "2026-11-29T17:00:00Z",
		"subject_matches_fixture": true,
		"subject_digest": concat(":", ["sha256", td.fixture_hex]),
		"measured_digest": concat(":", ["sha256", td.fixture_hex]),
		"predicate_subject": {},
		"binding": "manifest",
		"manifest_matches_fixture": true,
		"manifest": {"match": "path", "files": 1, "extra_subjects": 0},
	},
}

_slsa_input(base, att) := json.patch(base, [{"op": "replace", "path": "/attestations", "value": [att]}])

_slsa_decide(inp) := d if {
	d := intake.decision with input as inp with data.ckptgate.config.trust as _slsa_trust
}

_slsa_trust_codes(inp) := {r.code |
	some r in trust.reasons with input as inp with data.ckptgate.config.trust as _slsa_trust
}

test_slsa_per_file_is_allowed_for_pure_data_and_names_the_signer if {
	d := _slsa_decide(_slsa_input(td.pure_data_input, _slsa_attestation))
	d.allow == true
	some r in d.reasons
	r.code == "attestation_trusted"
	r.evidence.signers[0].signer_id == "release-builder"
}

test_slsa_never_satisfies_the_framework_plane if {
	d := _slsa_decide(_slsa_input(td.framework_input, _slsa_attestation))
	d.allow == false
	"attestation_wrong_predicate_type" in _codes(d)
}

test_slsa_from_a_builder_outside_the_signers_producers_is_untrusted if {
	att := json.patch(_slsa_attestation, [{
		"op": "replace", "path": "/statement/predicate/runDetails/builder/id",
		"value": "https://evil.example/builder",
	}])
	_slsa_trust_codes(_slsa_input(td.pure_data_input, att)) == {"attestation_untrusted_signer"}
}

test_slsa_without_a_builder_id_is_malformed if {
	att := json.patch(_slsa_attestation, [{"op": "remove", "path": "/statement/predicate/runDetails"}])
	"attestation_malformed" in _slsa_trust_codes(_slsa_input(td.pure_data_input, att))
}

test_slsa_with_subjects_beyond_the_checkpoint_is_refused_by_default if {
	att := json.patch(_slsa_attestation, [{"op": "replace", "path": "/verification/manifest/extra_subjects", "value": 1}])
	inp := _slsa_input(td.pure_data_input, att)
	_slsa_trust_codes(inp) == {"attestation_extra_subjects"}
	d := _slsa_decide(inp)
	d.allow == false
	d.refusal == "verification"
}

test_slsa_subjects_beyond_the_checkpoint_are_allowed_when_the_data_allows_them if {
	att := json.patch(_slsa_attestation, [{"op": "replace", "path": "/verification/manifest/extra_subjects", "value": 3}])
	d := intake.decision with input as _slsa_input(td.pure_data_input, att)
		with data.ckptgate.config.trust as _slsa_trust
		with data.ckptgate.config.intake.predicates.slsa_provenance.max_extra_subjects as 5
	d.allow == true
}

test_slsa_not_bound_to_the_fixture_is_a_digest_mismatch if {
	att := json.patch(_slsa_attestation, [{
		"op": "replace", "path": "/verification/manifest_matches_fixture",
		"value": false,
	}])
	_slsa_trust_codes(_slsa_input(td.pure_data_input, att)) == {"attestation_digest_mismatch"}
}

test_slsa_bound_by_the_fixture_digest_subject_is_trusted if {
	att := json.patch(_slsa_attestation, [
		{"op": "replace", "path": "/statement/subject/0/digest/sha256", "value": td.fixture_hex},
		{"op": "replace", "path": "/verification/binding", "value": "subject"},
		{"op": "remove", "path": "/verification/manifest"},
		{"op": "remove", "path": "/verification/manifest_matches_fixture"},
	])
	_slsa_trust_codes(_slsa_input(td.pure_data_input, att)) == set()
}
