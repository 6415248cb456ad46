# Tests of training provenance (SLSA Provenance v1, buildType https://ckptgate.dev/training/v1):
# trusted for a builder id named in the signer's builder_ids, it satisfies every plane, the
# framework plane included, when its producer versions pass the adapter's gate, its topology
# agrees with the layout and its fixture digest is the measured one; each failure has its reason.
package ckptgate.intake_test

import data.ckptgate.intake
import data.ckptgate.testdata_test as td
import data.ckptgate.trust

_training_builder := "https://ci.example/trainer"

_training_trust := {"signers": [{
	"id": "trainer",
	"kind": "key",
	"algorithm": "ed25519",
	"public_key": "-----BEGIN PUBLIC KEY-----\ntest\n-----END PUBLIC KEY-----\n",
	"spki_sha256": td.key_spki,
	"predicate_types": [_slsa_type],
	"producers": ["*"],
	"scopes": ["training_provenance"],
	"builder_ids": [_training_builder],
}]}

_training_attestation := {
	"source": "training.json",
	"statement": {
		"_type": "https://in-toto.io/Statement/v1",
		"subject": [{"name": "global_step1/mp_rank_00_model_states.pt", "digest": {"sha256": td.key_spki}}],
		"predicateType": _slsa_type,
		"predicate": {
			"buildDefinition": {
				"buildType": "https://ckptgate.dev/training/v1",
				"externalParameters": {"training_config": {}},
				"internalParameters": {
					"topology": {"world_size": 2, "dp": 2, "zero_stage": 2},
					"dtype": "bfloat16",
					"step": 1,
					"format": "deepspeed-zero2",
					"fixture_digest": concat(":", ["sha256", td.fixture_hex]),
				},
				"resolvedDependencies": [
					{
						"name": "deepspeed", "uri": "pkg:pypi/deepspeed@0.19.8",
						"annotations": {"kind": "producer", "version": "0.19.8", "source": "checkpoint"},
					},
					{
						"name": "torch", "uri": "pkg:pypi/torch@2.13.0",
						"annotations": {"kind": "producer", "version": "2.13.0", "source": "environment"},
					},
				],
			},
			"runDetails": {
				"builder": {"id": _training_builder},
				"metadata": {"invocationId": "run-1", "startedOn": "2026-11-29T16:00:00Z", "finishedOn": "2026-11-29T16:10:00Z"},
			},
		},
	},
	"signers": [json.patch(td.key_signer, [{"op": "replace", "path": "/signer_id", "value": "trainer"}])],
	"verification": _slsa_attestation.verification,
}

_framework_training_input(att) := json.patch(td.framework_input, [
	{"op": "replace", "path": "/attestations", "value": [att]},
	{"op": "add", "path": "/inspection/topology", "value": {"zero_stage": [1, 2], "dp": [2], "world_size": [2]}},
])

_training_decide(inp) := d if {
	d := intake.decision with input as inp with data.ckptgate.config.trust as _training_trust
		with data.ckptgate.config.qualified as td.qualified
}

_patched_training(ops) := json.patch(_training_attestation, ops)

test_training_provenance_satisfies_the_framework_plane if {
	d := _training_decide(_framework_training_input(_training_attestation))
	d.allow == true
	some r in d.reasons
	r.code == "attestation_trusted"
}

test_training_provenance_satisfies_the_pure_data_plane if {
	att := _patched_training([{
		"op": "replace", "path": "/statement/predicate/buildDefinition/internalParameters/format",
		"value": "hf-sharded-safetensors",
	}])
	inp := json.patch(td.pure_data_input, [{"op": "replace", "path": "/attestations", "value": [att]}])
	_training_decide(inp).allow == true
}

test_training_provenance_is_its_own_kind_not_generic_slsa if {
	trust.kinds(_training_attestation, data.ckptgate.config.intake.predicates) == {"training_provenance"}
	trust.kinds(_slsa_attestation, data.ckptgate.config.intake.predicates) == {"slsa_provenance"}
}

test_training_provenance_from_a_builder_the_trust_data_does_not_name_is_untrusted if {
	att := _patched_training([{
		"op": "replace", "path": "/statement/predicate/runDetails/builder/id",
		"value": "https://evil.example/builder",
	}])
	inp := _framework_training_input(att)
	codes := {r.code | some r in trust.reasons} with input as inp with data.ckptgate.config.trust as _training_trust
	codes == {"attestation_untrusted_signer"}
	_training_decide(inp).allow == false
}

test_training_provenance_needs_builder_ids_in_the_trust_entry if {
	bare := json.patch(_training_trust, [{"op": "remove", "path": "/signers/0/builder_ids"}])
	inp := _framework_training_input(_training_attestation)
	d := intake.decision with input as inp with data.ckptgate.config.trust as bare
		with data.ckptgate.config.qualified as td.qualified
	d.allow == false
	"attestation_untrusted_signer" in _codes(d)
}

test_a_slsa_scoped_signer_does_not_vouch_for_training_provenance if {
	slsa_only := json.patch(_training_trust, [{
		"op": "replace", "path": "/signers/0/scopes",
		"value": ["slsa_provenance"],
	}])
	inp := _framework_training_input(_training_attestation)
	d := intake.decision with input as inp with data.ckptgate.config.trust as slsa_only
		with data.ckptgate.config.qualified as td.qualified
	d.allow == false
}

test_training_provenance_whose_producer_version_has_no_passing_qualification_is_refused if {
	att := _patched_training([{
		"op": "replace", "path": "/statement/predicate/buildDefinition/resolvedDependencies/0/annotations/version",
		"value": "0.14.0",
	}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"training_producer_not_gated" in _codes(d)
}

test_training_provenance_naming_the_producer_twice_is_gated_on_both if {
	extra := {
		"name": "deepspeed", "uri": "pkg:pypi/deepspeed@0.14.0",
		"annotations": {"kind": "producer", "version": "0.14.0", "source": "flag"},
	}
	att := _patched_training([{
		"op": "add", "path": "/statement/predicate/buildDefinition/resolvedDependencies/-",
		"value": extra,
	}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"training_producer_not_gated" in _codes(d)
}

test_training_provenance_without_the_gated_producer_is_refused if {
	att := _patched_training([{"op": "remove", "path": "/statement/predicate/buildDefinition/resolvedDependencies/0"}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"training_producer_not_gated" in _codes(d)
}

test_training_provenance_whose_topology_contradicts_the_layout_is_refused if {
	att := _patched_training([{
		"op": "replace", "path": "/statement/predicate/buildDefinition/internalParameters/topology/zero_stage",
		"value": 3,
	}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	some r in d.reasons
	r.code == "training_topology_contradicts_layout"
	r.evidence.measured.topology.zero_stage == [1, 2]
}

test_training_provenance_for_another_fixture_digest_is_refused if {
	att := _patched_training([{
		"op": "replace", "path": "/statement/predicate/buildDefinition/internalParameters/fixture_digest",
		"value": concat(":", ["sha256", td.key_spki]),
	}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"training_digest_mismatch" in _codes(d)
}

test_training_provenance_for_another_format_is_refused if {
	att := _patched_training([{
		"op": "replace", "path": "/statement/predicate/buildDefinition/internalParameters/format",
		"value": "fsdp-full",
	}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"training_format_mismatch" in _codes(d)
}

test_training_provenance_whose_subjects_name_a_removed_file_is_refused if {
	att := _patched_training([{"op": "replace", "path": "/verification/manifest/extra_subjects", "value": 1}])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"attestation_extra_subjects" in _codes(d)
}

test_training_provenance_bound_by_the_fixture_digest_alone_is_refused if {
	att := _patched_training([
		{"op": "replace", "path": "/verification/binding", "value": "subject"},
		{"op": "remove", "path": "/verification/manifest"},
		{"op": "remove", "path": "/verification/manifest_matches_fixture"},
		{"op": "replace", "path": "/statement/subject/0/digest/sha256", "value": td.fixture_hex},
	])
	d := _training_decide(_framework_training_input(att))
	d.allow == false
	"training_not_bound_per_file" in _codes(d)
}

# Training provenance signed under an X.509 certificate (a certificate-signed Sigstore bundle, verified by
# Python against --certificate-chain): trusted through a certificate entry naming a SAN, the root and the
# builder id, exactly as for a key.
_x509_training_root := concat("", ["ab", substring(td.key_spki, 2, 62)])

_x509_training_trust(builders) := {"signers": [{
	"id": "ca-trainer", "kind": "certificate", "identity": _training_builder, "root_sha256": _x509_training_root,
	"predicate_types": [_slsa_type], "producers": ["*"], "scopes": ["training_provenance"],
	"builder_ids": builders,
}]}

_x509_training(root) := json.patch(_training_attestation, [{"op": "replace", "path": "/signers", "value": [{
	"kind": "certificate", "signer_id": "ca-trainer", "identity": _training_builder,
	"identities": ["ml@example.com", _training_builder], "issuer": "CN=root", "root_sha256": root,
	"subject": "CN=trainer", "not_after": "2027-01-01T00:00:00+00:00",
}]}])

_x509_training_decide(att, builders) := d if {
	d := intake.decision with input as _framework_training_input(att)
		with data.ckptgate.config.trust as _x509_training_trust(builders)
		with data.ckptgate.config.qualified as td.qualified
}

test_training_provenance_under_a_certificate_is_trusted_for_its_san_root_and_builder if {
	_x509_training_decide(_x509_training(_x509_training_root), [_training_builder]).allow == true
}

test_training_provenance_under_a_certificate_for_another_builder_is_untrusted if {
	d := _x509_training_decide(_x509_training(_x509_training_root), ["https://ci.example/another"])
	d.allow == false
	"attestation_untrusted_signer" in _codes(d)
}

test_training_provenance_under_a_certificate_of_another_root_is_untrusted if {
	d := _x509_training_decide(_x509_training(td.key_spki), [_training_builder])
	d.allow == false
	"attestation_untrusted_signer" in _codes(d)
}
