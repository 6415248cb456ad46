# Tests of OpenSSF Model Signing statements (helpers are in intake_test.rego). A statement that
# Python bound by its per-file manifest, signed by a key named on the command line
# (input.offered_keys), is trusted for that predicate type only; it satisfies the pure-data and
# static-pickle planes, never the framework plane.
package ckptgate.intake_test

import data.ckptgate.testdata_test as td
import data.ckptgate.trust

_oms_type := "https://model_signing/signature/v1.0"

_offered_spki := "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

_offered_key := {
	"kind": "key", "signer_id": "key:cccccccccccccccc", "source": "pub.pem",
	"algorithm": "ecdsa-p256", "spki_sha256": _offered_spki,
}

_offered_signer := {
	"kind": "key", "signer_id": "key:cccccccccccccccc", "keyid": null,
	"spki_sha256": _offered_spki, "algorithm": "ecdsa-p256", "offered": "pub.pem",
}

_oms_attestation := {
	"source": "model.sig",
	"statement": {
		"_type": "https://in-toto.io/Statement/v1",
		"subject": [{"name": "ck", "digest": {"sha256": td.key_spki}}],
		"predicateType": _oms_type,
		"predicate": {
			"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": false, "ignore_paths": []},
			"resources": [{"name": "model.safetensors", "algorithm": "sha256", "digest": td.key_spki}],
		},
	},
	"signers": [_offered_signer],
	"verification": {
		"method": "model_signing",
		"checks": ["bundle", "signature", "statement_schema", "serialization", "resources_bound"],
		"verified_at": "2026-11-29T17:00:00Z",
		"subject_matches_fixture": true,
		"subject_digest": concat(":", ["sha256", td.fixture_hex]),
		"measured_digest": concat(":", ["sha256", td.fixture_hex]),
		"predicate_subject": {},
		"binding": "manifest",
		"manifest_matches_fixture": true,
	},
}

_oms_input(base, att, keys) := json.patch(base, [
	{"op": "replace", "path": "/attestations", "value": [att]},
	{"op": "add", "path": "/offered_keys", "value": keys},
])

_trust_codes(inp) := {r.code |
	some r in trust.reasons with input as inp with data.ckptgate.config.trust as td.trust
}

test_oms_with_an_offered_key_is_allowed_for_pure_data if {
	d := _decide(_oms_input(td.pure_data_input, _oms_attestation, [_offered_key]))
	d.allow == true
	"attestation_trusted" in _codes(d)
}

test_oms_never_satisfies_the_framework_plane if {
	d := _decide(_oms_input(td.framework_input, _oms_attestation, [_offered_key]))
	d.allow == false
	"attestation_wrong_predicate_type" in _codes(d)
}

test_oms_without_the_offered_key_is_untrusted if {
	_trust_codes(_oms_input(td.pure_data_input, _oms_attestation, [])) == {"attestation_untrusted_signer"}
	d := _decide(_oms_input(td.pure_data_input, _oms_attestation, []))
	d.allow == false
}

test_an_offered_key_never_trusts_a_ckptgate_predicate if {
	att := json.patch(
		td.pure_data_input.attestations[0],
		[{"op": "replace", "path": "/signers", "value": [_offered_signer]}],
	)
	_trust_codes(_oms_input(td.pure_data_input, att, [_offered_key])) == {"attestation_untrusted_signer"}
}

test_an_offered_key_with_another_spki_is_untrusted if {
	other := object.union(_offered_key, {"spki_sha256": td.key_spki})
	_trust_codes(_oms_input(td.pure_data_input, _oms_attestation, [other])) == {"attestation_untrusted_signer"}
}

test_oms_without_the_manifest_binding_is_not_bound if {
	att := json.patch(_oms_attestation, [{"op": "remove", "path": "/verification/manifest_matches_fixture"}])
	"attestation_digest_mismatch" in _trust_codes(_oms_input(td.pure_data_input, att, [_offered_key]))
}

test_oms_bound_to_another_measured_digest_is_refused if {
	att := json.patch(_oms_attestation, [{
		"op": "replace", "path": "/verification/subject_digest",
		"value": concat(":", ["sha256", td.key_spki]),
	}])
	"attestation_digest_mismatch" in _trust_codes(_oms_input(td.pure_data_input, att, [_offered_key]))
}

test_a_manifest_statement_without_resources_is_malformed if {
	att := json.patch(_oms_attestation, [{"op": "replace", "path": "/statement/predicate/resources", "value": []}])
	"attestation_malformed" in _trust_codes(_oms_input(td.pure_data_input, att, [_offered_key]))
}

_root_sha := "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"

_cert_signer := {
	"kind": "certificate", "signer_id": null, "identity": "ml@example.com",
	"identities": ["ml@example.com", "https://ci.example.com/release"], "issuer": "CN=Example Root",
	"root_sha256": _root_sha, "subject": "CN=ml", "not_after": "2027-01-01T00:00:00+00:00",
}

_cert_trust(identity, root) := {"signers": [{
	"id": "example-release", "kind": "certificate", "identity": identity, "root_sha256": root,
	"predicate_types": [_oms_type], "producers": ["*"], "scopes": ["*"],
}]}

_cert_att := json.patch(_oms_attestation, [{"op": "replace", "path": "/signers", "value": [_cert_signer]}])

_cert_decide(trust_data) := d if {
	d := data.ckptgate.intake.decision with input as _oms_input(td.pure_data_input, _cert_att, [])
		with data.ckptgate.config.trust as trust_data
}

test_a_certificate_signer_named_by_trust_data_is_allowed_for_pure_data if {
	d := _cert_decide(_cert_trust("https://ci.example.com/release", _root_sha))
	d.allow == true
	"attestation_trusted" in _codes(d)
}

test_a_certificate_signer_under_another_root_is_untrusted if {
	d := _cert_decide(_cert_trust("ml@example.com", td.key_spki))
	d.allow == false
}

test_a_certificate_signer_with_another_identity_is_untrusted if {
	d := _cert_decide(_cert_trust("someone@example.com", _root_sha))
	d.allow == false
}

test_a_certificate_signer_is_never_an_offered_key if {
	d := _decide(_oms_input(td.pure_data_input, _cert_att, [_offered_key]))
	d.allow == false
}

test_a_sigstore_signer_named_by_trust_data_is_allowed_for_pure_data if {
	signer := {
		"kind": "sigstore", "signer_id": "ml-ci", "identity": "https://ci.example.com/release",
		"issuer": "https://issuer.example.com", "extensions": {},
	}
	att := json.patch(_oms_attestation, [{"op": "replace", "path": "/signers", "value": [signer]}])
	trust_data := {"signers": [{
		"id": "ml-ci", "kind": "sigstore", "identity": signer.identity, "issuer": signer.issuer,
		"predicate_types": [_oms_type], "producers": ["*"], "scopes": ["*"],
	}]}
	d := data.ckptgate.intake.decision with input as _oms_input(td.pure_data_input, att, [])
		with data.ckptgate.config.trust as trust_data
	d.allow == true
	other := json.patch(trust_data, [{"op": "replace", "path": "/signers/0/issuer", "value": "https://other.example"}])
	denied := data.ckptgate.intake.decision with input as _oms_input(td.pure_data_input, att, [])
		with data.ckptgate.config.trust as other
	denied.allow == false
}
