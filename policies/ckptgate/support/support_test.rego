# METADATA
# title: ckptgate.support_test
# description: Table-driven tests for every support status and row reason code.
package ckptgate.support_test

import data.ckptgate.support
import data.ckptgate.testdata_test as td

_head := {
	"commit": "3333333333333333333333333333333333333333",
	"candidate_commit": td.commit,
	"source_tree": "tree-outside-evidence",
	"candidate_source_tree": "tree-outside-evidence",
	"evidence_commits": ["3333333333333333333333333333333333333333"],
}

_other_commit := "2222222222222222222222222222222222222222"

_input(atts) := {"now": "2026-11-29T17:00:00Z", "head": _head, "attestations": atts}

_att(ops) := json.patch(td.attestation, ops)

_set(path, value) := _att([{"op": "replace", "path": path, "value": value}])

_rows(inp) := rs if {
	rs := support.rows with input as inp with data.ckptgate.config.trust as td.trust
}

_row(att) := _rows(_input([att]))[0]

_row_codes(row) := {r.code | some r in row.reasons}

# Each row reason code, the attestation that must produce it, and the status it must give.
_cases := {
	"attestation_malformed": [_att([{"op": "remove", "path": "/statement/predicate/validity"}]), "refused"],
	"attestation_untrusted_signer": [_set("/signers/0/spki_sha256", "00"), "refused"],
	"attestation_not_yet_valid": [_set("/statement/predicate/validity/issued_at", "2026-12-01T00:00:00Z"), "refused"],
	"attestation_digest_mismatch": [
		_set("/statement/predicate/fixture/digest", concat(":", ["sha256", td.key_spki])),
		"refused",
	],
	"attestation_predicate_mismatch": [_att(td.co_subject_ops("")), "refused"],
	"result_failed": [_set("/statement/predicate/result/status", "failed"), "refused"],
	"result_not_retained": [_set("/retained_result/sha256", null), "refused"],
	"candidate_commit_is_evidence_commit": [_set("/statement/predicate/candidate_commit", _head.commit), "refused"],
	"attestation_wrong_commit": [_set("/statement/predicate/candidate_commit", _other_commit), "stale"],
	"attestation_expired": [_set("/statement/predicate/validity/expires_at", "2026-11-29T16:59:59Z"), "stale"],
	"claim_incomplete": [_set("/statement/predicate/topology", {}), "unqualified"],
	"producer_release_unqualified": [_set("/statement/predicate/producer/name", "torch"), "unqualified"],
	"adapter_unknown": [_set("/statement/predicate/adapter/name", "onnx"), "unqualified"],
}

test_every_row_case_has_its_code_and_status if {
	every code, case in _cases {
		row := _row(case[0])
		code in _row_codes(row)
		row.status == case[1]
	}
}

test_supported_row_carries_every_claim_rule_3_field if {
	row := _row(td.attestation)
	row.status == "supported"
	row.reasons == []
	row.adapter == "deepspeed-zero"
	row.format == ["deepspeed-zero2", "deepspeed-zero3"]
	row.adapter_version == "0.1.0"
	row.producer == "deepspeed"
	row.producer_version == "0.19.8"
	row.fixture_digest == concat(":", ["sha256", td.fixture_hex])
	row.candidate_commit == td.commit
	row.topology.world_size == 2
	row.environment.python == "3.11.2"
	row.evidence.location == "attestations/evidence/run.log"
	row.evidence.signers == ["ci-test"]
}

test_rejected_attestation_is_a_refused_row if {
	inp := object.union(_input([]), {"rejected_attestations": [{
		"source": "attestations/bad.intoto.json",
		"code": "verify.dsse.bad_signature",
		"message": "m",
	}]})
	rows := _rows(inp)
	count(rows) == 1
	rows[0].status == "refused"
	rows[0].reasons[0].code == "attestation_rejected"
	rows[0].source == "attestations/bad.intoto.json"
}

test_target_without_supported_row_is_unqualified if {
	inp := object.union(_input([td.attestation]), {"targets": ["deepspeed-zero", "dcp"]})
	rows := _rows(inp)
	count(rows) == 2
	rows[1].adapter == "dcp"
	rows[1].status == "unqualified"
	rows[1].reasons[0].code == "no_supported_attestation"
	rows[1].format == ["dcp-hf-safetensors", "dcp-torch-save"]
}

test_non_qualification_attestations_make_no_row if {
	prov := _set("/statement/predicateType", td.provenance)
	inp := _input([prov, td.attestation])
	rows := _rows(inp)
	count(rows) == 1
	ignored := support.ignored with input as inp with data.ckptgate.config.trust as td.trust
	ignored == {{"attestation": 0, "source": td.attestation.source, "predicate_type": td.provenance}}
}

test_summary_counts_rows_by_status if {
	inp := _input([td.attestation, _cases.result_failed[0], _cases.attestation_expired[0]])
	s := support.summary with input as inp with data.ckptgate.config.trust as td.trust
	s == {"supported": 1, "stale": 1, "unqualified": 0, "refused": 1}
}

test_every_row_reason_code_has_a_status_class if {
	every code, _ in _cases {
		support.status_of[code] in {"refused", "stale", "unqualified"}
	}
}

_qualified(atts) := q if {
	q := support.qualified with input as _input(atts) with data.ckptgate.config.trust as td.trust
}

_retained(att, fmt) := json.patch(att, [{"op": "add", "path": "/retained_result/format", "value": fmt}])

test_the_generated_gate_takes_passing_qualifications_with_retained_evidence if {
	q := _qualified([_retained(td.attestation, "deepspeed-zero2")])
	q.adapters["deepspeed-zero"].versions == {"deepspeed-zero2": ["0.19.8"]}
	[row] := q.adapters["deepspeed-zero"].rows
	row.format == "deepspeed-zero2"
	row.producer_version == "0.19.8"
	row.topology.dp == 2
	row.evidence == "attestations/evidence/run.log"
	q.adapters.dcp.rows == []
}

test_a_new_release_that_passes_qualification_enters_the_gate_and_its_row_is_supported if {
	att := _retained(_set("/statement/predicate/producer/version", "0.18.9"), "deepspeed-zero3")
	_qualified([att]).adapters["deepspeed-zero"].versions == {"deepspeed-zero3": ["0.18.9"]}
	_row(att).status == "supported" # the committed gate (data.ckptgate.config.qualified) is not consulted
}

test_a_qualification_at_another_commit_stays_in_the_gate if {
	att := _retained(_cases.attestation_wrong_commit[0], "deepspeed-zero2")
	count(_qualified([att]).adapters["deepspeed-zero"].rows) == 1
}

test_no_failing_or_unretained_or_untrusted_qualification_enters_the_gate if {
	codes := [
		"result_failed", "result_not_retained", "attestation_untrusted_signer",
		"claim_incomplete", "attestation_expired",
	]
	every code in codes {
		att := _retained(_cases[code][0], "deepspeed-zero2")
		_qualified([att]).adapters["deepspeed-zero"].rows == []
	}
}

_runtime := {"lock": "runtime-torch-2.10.0", "lock_sha256": concat("", ["ab" | some _ in numbers.range(1, 32)])}

test_a_runtime_qualification_is_its_own_supported_row_but_no_gate_row if {
	add := [{"op": "add", "path": "/statement/predicate/environment/runtime", "value": _runtime}]
	runtime := _retained(_att(add), "deepspeed-zero2")
	own := _retained(td.attestation, "deepspeed-zero2")
	row := _row(runtime)
	row.status == "supported"
	row.environment.runtime.lock == "runtime-torch-2.10.0"
	_qualified([runtime]).adapters["deepspeed-zero"].rows == []
	[gate_row] := _qualified([own, runtime]).adapters["deepspeed-zero"].rows
	gate_row.evidence == "attestations/evidence/run.log"
	count([r | some r in _rows(_input([own, runtime])); r.status == "supported"]) == 2
}

test_a_qualification_without_a_retained_format_of_its_adapter_does_not_enter_the_gate if {
	_qualified([td.attestation]).adapters["deepspeed-zero"].rows == []
	_qualified([_retained(td.attestation, "dcp-torch-save")]).adapters["deepspeed-zero"].rows == []
	_qualified([_retained(td.attestation, "dcp-torch-save")]).adapters.dcp.rows == []
}

test_an_overlay_restriction_makes_a_qualified_row_unqualified if {
	narrowed := {"any": false, "exact": ["0.19.7"], "ranges": []}
	row := _row(td.attestation) with data.ckptgate.config.gates.adapters["deepspeed-zero"].versions as narrowed
	row.status == "unqualified"
	"producer_release_unqualified" in _row_codes(row)
}

# A mapping qualification: megatron-core, its checks_run naming the logits check, its retained log
# recording the mapping's family.
_mapping_att(ops) := json.patch(_retained(td.attestation, "megatron-torch-dist"), array.concat(
	[
		{"op": "replace", "path": "/statement/predicate/producer", "value": {"name": "megatron-core", "version": "0.16.1"}},
		{"op": "replace", "path": "/statement/predicate/adapter/name", "value": "megatron-torch-dist"},
		{"op": "replace", "path": "/statement/predicate/topology", "value": _mapping_topology},
		{"op": "replace", "path": "/statement/predicate/result/checks_run", "value": ["logits_parity_1e-4_fp32"]},
		{"op": "add", "path": "/retained_result/mapping", "value": {"family": "mixtral", "max_abs_delta": 0.000002}},
	],
	ops,
))

_mapping_topology := {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 2, "etp": 1, "world_size": 2}

test_a_passing_mapping_qualification_is_a_generated_mapping_row_and_not_a_gate_row if {
	q := _qualified([_mapping_att([])])
	[row] := q.hf_mapping.qualified
	object.filter(row, ["family", "release", "tp", "pp", "ep"]) == {
		"family": "mixtral", "release": "0.16.1",
		"tp": 1, "pp": 1, "ep": 2,
	}
	row.checks_run == ["logits_parity_1e-4_fp32"]
	row.max_abs_delta == 0.000002
	q.adapters["megatron-torch-dist"].rows == [] # it never qualifies the name-preserving reading
}

test_no_failing_or_unretained_mapping_qualification_is_a_mapping_row if {
	failed := {"op": "replace", "path": "/statement/predicate/result/status", "value": "failed"}
	_qualified([_mapping_att([failed])]).hf_mapping.qualified == []
	unretained := {"op": "replace", "path": "/retained_result/sha256", "value": null}
	_qualified([_mapping_att([unretained])]).hf_mapping.qualified == []
	no_family := {"op": "remove", "path": "/retained_result/mapping"}
	_qualified([_mapping_att([no_family])]).hf_mapping.qualified == []
}

test_a_name_preserving_qualification_is_no_mapping_row if {
	_qualified([_retained(td.attestation, "deepspeed-zero2")]).hf_mapping.qualified == []
}

# One fixture digest, several releases: a qualification naming another release (producer_releases)
# gets a row for it when the provenance statement it names vouches for that release.
_release := {
	"name": "deepspeed", "version": "0.18.9",
	"provenance": "attestations/prov-0189.dsse.json", "manifest": "written_by/ds0189.json",
}

_named_release := _att([{"op": "add", "path": "/statement/predicate/producer_releases", "value": [_release]}])

_vouching(ops) := json.patch(td.attestation, array.concat(
	[
		{"op": "replace", "path": "/source", "value": _release.provenance},
		{"op": "replace", "path": "/statement/predicateType", "value": td.provenance},
		{"op": "replace", "path": "/statement/predicate/producer/version", "value": "0.18.9"},
		{"op": "replace", "path": "/statement/predicate/fixture/manifest", "value": _release.manifest},
	],
	ops,
))

_release_row(atts) := [row |
	some row in _rows(_input(atts))
	row.producer_version == "0.18.9"
][0]

_with_format(att) := object.union(att, {"retained_result": object.union(
	att.retained_result,
	{"format": "deepspeed-zero2"},
)})

_gate(atts) := gate if {
	gate := support.qualified with input as _input([_with_format(a) | some a in atts])
		with data.ckptgate.config.trust as td.trust
}

test_a_vouched_release_gets_its_own_supported_row_and_gate_version if {
	row := _release_row([_named_release, _vouching([])])
	row.status == "supported"
	row.producer == "deepspeed"
	row.evidence.provenance == _release.provenance
	row.fixture_digest == concat(":", ["sha256", td.fixture_hex])
	gate := _gate([_named_release, _vouching([])])
	gate.adapters["deepspeed-zero"].versions["deepspeed-zero2"] == ["0.18.9", "0.19.8"]
}

test_every_unvouched_release_is_unqualified_and_not_gated if {
	every atts in [
		[_named_release],
		[_named_release, _vouching([{"op": "replace", "path": "/statement/predicate/producer/version", "value": "0.17.6"}])],
		[_named_release, _vouching([{"op": "replace", "path": "/statement/predicate/fixture/manifest", "value": "x"}])],
		[_named_release, _vouching([{"op": "replace", "path": "/signers/0/spki_sha256", "value": "00"}])],
		[_named_release, _vouching([{
			"op": "replace", "path": "/statement/predicate/fixture/digest",
			"value": concat(":", ["sha256", td.key_spki]),
		}])],
	] {
		row := _release_row(atts)
		row.status == "unqualified"
		"producer_release_unproven" in _row_codes(row)
		_gate(atts).adapters["deepspeed-zero"].versions["deepspeed-zero2"] == ["0.19.8"]
	}
}
