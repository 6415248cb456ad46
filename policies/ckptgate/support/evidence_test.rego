# Tests of the row problems (evidence.rego); helpers are in support_test.rego.
package ckptgate.support_test

import data.ckptgate.testdata_test as td

test_refused_when_result_failed if {
	row := _row(_cases.result_failed[0])
	row.status == "refused"
	"result_failed" in _row_codes(row)
}

test_refused_when_the_retained_result_is_missing_or_other_bytes if {
	every held in [null, concat(":", ["sha256", td.fixture_hex])] {
		row := _row(_set("/retained_result/sha256", held))
		row.status == "refused"
		"result_not_retained" in _row_codes(row)
	}
}

test_refused_when_the_retained_result_fact_is_about_another_location if {
	row := _row(_set("/retained_result/location", "attestations/evidence/other.log"))
	row.status == "refused"
	"result_not_retained" in _row_codes(row)
}

test_unqualified_when_head_evidence_commits_is_not_a_list if {
	every value in [null, "x", 1, {}] {
		row := _rows(json.patch(_input([td.attestation]), [{
			"op": "replace", "path": "/head/evidence_commits",
			"value": value,
		}]))[0]
		row.status == "unqualified"
		"candidate_commit_unverified" in _row_codes(row)
	}
}

test_refused_when_the_retained_result_fact_is_absent if {
	row := _row(_att([{"op": "remove", "path": "/retained_result"}]))
	row.status == "refused"
	"result_not_retained" in _row_codes(row)
}

test_a_malformed_location_is_incomplete_not_also_unretained if {
	row := _row(_set("/statement/predicate/result/evidence/location", "../outside.log"))
	row.status == "unqualified"
	not "result_not_retained" in _row_codes(row)
}

test_refused_when_signer_untrusted if _row(_cases.attestation_untrusted_signer[0]).status == "refused"

test_refused_when_candidate_names_evidence_commit if {
	_row(_cases.candidate_commit_is_evidence_commit[0]).status == "refused"
}

test_stale_when_qualified_at_another_candidate_commit if {
	_row(_cases.attestation_wrong_commit[0]).status == "stale"
}

test_stale_when_expired if _row(_cases.attestation_expired[0]).status == "stale"

test_stale_when_now_missing if {
	row := _rows({"head": _head, "attestations": [td.attestation]})[0]
	row.status == "stale"
	_row_codes(row) == {"attestation_freshness_unchecked"}
}

test_unqualified_when_producer_version_is_a_range if {
	row := _row(_set("/statement/predicate/producer/version", ">=0.19"))
	row.status == "unqualified"
	some r in row.reasons
	r.code == "claim_incomplete"
	r.evidence.field == "producer.version"
}

test_unqualified_when_evidence_location_escapes if {
	row := _row(_set("/statement/predicate/result/evidence/location", "../elsewhere.log"))
	row.status == "unqualified"
	some r in row.reasons
	r.evidence.field == "result.evidence.location"
}

test_unqualified_when_result_not_retained if {
	row := _row(_att([{"op": "remove", "path": "/statement/predicate/result/evidence"}]))
	row.status == "unqualified"
	{r.evidence.field | some r in row.reasons} == {"result.evidence.digest", "result.evidence.location"}
}

test_refused_beats_stale_and_unqualified if {
	row := _row(_att([
		{"op": "replace", "path": "/statement/predicate/result/status", "value": "error"},
		{"op": "replace", "path": "/statement/predicate/candidate_commit", "value": _other_commit},
		{"op": "replace", "path": "/statement/predicate/topology", "value": {}},
	]))
	row.status == "refused"
	_row_codes(row) == {"result_failed", "attestation_wrong_commit", "claim_incomplete"}
}

test_unqualified_when_source_trees_differ if {
	inp := json.patch(_input([td.attestation]), [{"op": "replace", "path": "/head/source_tree", "value": "other"}])
	row := _rows(inp)[0]
	row.status == "unqualified"
	some r in row.reasons
	r.code == "candidate_commit_unverified"
	r.evidence.failed == ["trees_equal"]
}

test_unqualified_when_candidate_listed_as_evidence_commit if {
	inp := json.patch(_input([td.attestation]), [{"op": "add", "path": "/head/evidence_commits/-", "value": td.commit}])
	row := _rows(inp)[0]
	row.status == "unqualified"
	some r in row.reasons
	r.evidence.failed == ["candidate_not_evidence"]
}

test_unqualified_when_head_missing if {
	row := _rows({"now": "2026-11-29T17:00:00Z", "attestations": [td.attestation]})[0]
	row.status == "unqualified"
	some r in row.reasons
	r.evidence.failed == ["candidate_commit", "commit", "source_tree", "trees_equal"]
}

test_supported_when_head_is_the_candidate if {
	inp := json.patch(_input([td.attestation]), [
		{"op": "replace", "path": "/head/commit", "value": td.commit},
		{"op": "replace", "path": "/head/evidence_commits", "value": []},
	])
	_rows(inp)[0].status == "supported"
}
