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
	"producer_version_not_gated": [_set("/statement/predicate/producer/version", "0.18.0"), "unqualified"],
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
