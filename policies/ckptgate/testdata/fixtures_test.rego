# METADATA
# title: ckptgate.testdata_test
# description: >-
#   Shared test inputs: one intake input that is allowed on the framework plane, the trust data
#   the tests use instead of the committed trust data, and helpers to derive bad inputs from it.
package ckptgate.testdata_test

# METADATA
# description: The qualification predicate type.
qualification := "https://ckptgate.dev/attestation/qualification/v1"

# METADATA
# description: The fixture provenance predicate type.
provenance := "https://ckptgate.dev/attestation/fixture-provenance/v1"

# METADATA
# description: A fixture digest hex.
fixture_hex := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

# METADATA
# description: The SPKI digest of the test key.
key_spki := "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

# METADATA
# description: The candidate commit of the test inputs.
commit := "1111111111111111111111111111111111111111"

# METADATA
# description: Trust data for tests, with one key for every predicate, one Sigstore identity scoped to torch.
trust := {"signers": [
	{
		"id": "ci-test",
		"kind": "key",
		"algorithm": "ed25519",
		"public_key": "-----BEGIN PUBLIC KEY-----\ntest\n-----END PUBLIC KEY-----\n",
		"spki_sha256": key_spki,
		"predicate_types": [qualification, provenance],
		"producers": ["*"],
		"scopes": ["*"],
	},
	{
		"id": "release-workflow",
		"kind": "sigstore",
		"identity": "https://github.com/example/ckptgate/.github/workflows/qualify.yml@refs/heads/main",
		"issuer": "https://token.actions.githubusercontent.com",
		"predicate_types": [qualification],
		"producers": ["torch"],
		"scopes": ["qualification"],
	},
]}

# METADATA
# description: The signer facts of the test key, as Python reports them.
key_signer := {
	"kind": "key",
	"signer_id": "ci-test",
	"keyid": "hint-only",
	"spki_sha256": key_spki,
	"algorithm": "ed25519",
}

# METADATA
# description: A verified qualification attestation for the fixture, valid at the request time.
attestation := {
	"source": "attestations/sha256-aaaa.intoto.json",
	"statement": {
		"_type": "https://in-toto.io/Statement/v1",
		"subject": [{"name": "fixture", "digest": {"sha256": fixture_hex}}],
		"predicateType": qualification,
		"predicate": {
			"producer": {"name": "deepspeed", "version": "0.19.8"},
			"adapter": {"name": "deepspeed-zero", "version": "0.1.0"},
			"fixture": {"digest": concat(":", ["sha256", fixture_hex]), "digest_algorithm": "sha256", "manifest": "m"},
			"candidate_commit": commit,
			"environment": {"python": "3.11.2", "torch": "2.13.0", "os": "linux", "arch": "x86_64", "accelerator": "cpu"},
			"topology": {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "world_size": 2, "zero_stage": 2},
			"result": {
				"status": "passed",
				"checks_run": ["tensors_equal"],
				"evidence": {"digest": concat(":", ["sha256", key_spki]), "location": "attestations/evidence/run.log"},
			},
			"validity": {"issued_at": "2026-11-01T00:00:00Z", "expires_at": "2027-11-01T00:00:00Z"},
		},
	},
	"signers": [key_signer],
	"verification": {
		"method": "dsse",
		"checks": ["envelope", "payload_type", "signature", "statement_schema", "subject_digest"],
		"verified_at": "2026-11-29T17:00:00Z",
		"subject_matches_fixture": true,
		"subject_digest": concat(":", ["sha256", fixture_hex]),
		"predicate_subject": {"fixture.digest": true},
	},
	"retained_result": {"location": "attestations/evidence/run.log", "sha256": concat(":", ["sha256", key_spki])},
}

# METADATA
# description: An intake input that is allowed on the framework plane.
framework_input := {
	"request": {
		"action": "intake",
		"now": "2026-11-29T17:00:00Z",
		"candidate_commit": null,
		"target": "hf-sharded-safetensors",
	},
	"fixture": {"digest": concat(":", ["sha256", fixture_hex]), "algorithm": "sha256", "file_count": 3},
	"inspection": {
		"format": "deepspeed-zero2",
		"clean": true,
		"consolidatable": true,
		"loaders": ["deepspeed", "json"],
		"findings": [],
		"files": [],
		"layout": {},
	},
	"attestations": [attestation],
	"rejected_attestations": [],
	"containment": {"preflighted": true, "controls": {
		"no_new_privs": true, "seccomp": true, "rlimits": true, "cgroup_v2": false,
		"user_ns": true, "net_ns": true, "ipc_ns": true, "pid_ns": true, "openat2": true,
	}},
}

# METADATA
# description: An intake input for a pure-data checkpoint with a provenance attestation.
pure_data_input := json.patch(framework_input, [
	{"op": "replace", "path": "/inspection/format", "value": "hf-sharded-safetensors"},
	{"op": "replace", "path": "/inspection/loaders", "value": ["json", "safetensors"]},
	{"op": "replace", "path": "/attestations/0/statement/predicateType", "value": provenance},
	{
		"op": "replace",
		"path": "/attestations/0/statement/predicate/producer",
		"value": {"name": "torch", "version": "2.13.0"},
	},
	{"op": "replace", "path": "/containment", "value": null},
])

# METADATA
# description: Apply a JSON patch (a list of operations) to the framework input.
patched(ops) := json.patch(framework_input, ops)

# METADATA
# description: The framework input with one value replaced at a JSON pointer.
with_value(path, value) := patched([{"op": "replace", "path": path, "value": value}])

# METADATA
# description: >-
#   JSON patch operations (under prefix, e.g. "/attestations/0") that turn the attestation into
#   one whose predicate is about another fixture (key_spki as its digest), with the measured
#   fixture added as a second subject: Python binds the second subject and reports that
#   predicate.fixture.digest does not name it.
co_subject_ops(prefix) := [
	{"op": "replace", "path": concat("", [prefix, "/statement/subject"]), "value": [
		{"name": "other", "digest": {"sha256": key_spki}},
		{"name": "fixture", "digest": {"sha256": fixture_hex}},
	]},
	{
		"op": "replace", "path": concat("", [prefix, "/statement/predicate/fixture/digest"]),
		"value": concat(":", ["sha256", key_spki]),
	},
	{"op": "replace", "path": concat("", [prefix, "/verification/predicate_subject"]), "value": {"fixture.digest": false}},
]

# METADATA
# description: >-
#   A generated gate (data.ckptgate.config.qualified) for the tests: what qualifications would
#   give, fixed here so the tests do not depend on the committed attestations.
qualified := {"adapters": {
	"deepspeed-zero": {"producer": "deepspeed", "rows": [
		_qualified_row("deepspeed-zero2", "deepspeed", "0.19.8", _topology(1, 1, 2, 2)),
		_qualified_row("deepspeed-zero3", "deepspeed", "0.19.8", _topology(1, 1, 2, 2)),
	]},
	"dcp": {"producer": "torch", "rows": [
		_qualified_row("dcp-torch-save", "torch", "2.13.0", _topology(1, 1, 2, 2)),
		_qualified_row("dcp-hf-safetensors", "torch", "2.13.0", _topology(1, 1, 2, 2)),
	]},
	"megatron-torch-dist": {"producer": "megatron-core", "rows": [_megatron_row]},
	"hf-safetensors": {"producer": "*", "rows": []},
}}

_megatron_row := _qualified_row("megatron-torch-dist", "megatron-core", "0.16.1", _topology(2, 1, 1, 2))

_topology(tp, pp, dp, ws) := {"tp": tp, "pp": pp, "dp": dp, "cp": 1, "ep": 1, "etp": 1, "world_size": ws}

_qualified_row(fmt, producer, version, topology) := {
	"format": fmt, "producer": producer, "producer_version": version, "topology": topology,
	"fixture_digest": concat(":", ["sha256", fixture_hex]), "attestation": "a.json", "evidence": "e.log",
}
