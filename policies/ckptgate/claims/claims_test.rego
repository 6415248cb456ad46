# METADATA
# title: ckptgate.claims_test
# description: One passing and one failing sentence for every claim rule.
package ckptgate.claims_test

import data.ckptgate.claims

_refs := ["R01", "R11", "R14", "R17", "R27", "R28", "R30", "R32"]

_rows := [
	{
		"format": "hf-sharded-safetensors",
		"adapter": "hf-safetensors",
		"status": "supported",
		"producer": "huggingface_hub",
		"producer_version": "2.4.0",
	},
	{"format": "torch-dcp", "adapter": "dcp", "status": "unqualified"},
]

_sentence(text, citations) := {"file": "docs/x.md", "line": 3, "text": text, "citations": citations}

# Claim facts as ckptgate.evidence.claimfacts extracts them, one clause.
_clause(overrides) := object.union(
	{
		"text": "", "connective": "", "vendor_phrasing": false, "negation": false,
		"systems": [], "versions": [], "capability": [], "safety": [], "topics": [],
		"universal": [], "scope": [], "cross_platform": [], "cross_platform_negated": false,
		"platform_bounds": [], "hypothetical": false, "unknown": [],
	},
	overrides,
)

_facts(clauses, topics) := {
	"register_entry": false, "clauses": clauses, "topics": topics, "scope": [],
	"vendor_phrasing": false, "interrogative": false,
}

_fact_codes(text, citations, clauses, topics) := {v.code |
	some v in claims.violations with input as {
		"sentences": [object.union(_sentence(text, citations), {"facts": _facts(clauses, topics)})],
		"references": _refs,
		"matrix": _rows,
	}
}

_cap(class, negated, agent) := {"class": class, "term": class, "passive": false, "negated": negated, "agent": agent}

_safe(class, negated) := {"class": class, "term": class, "negated": negated}

_mention(id) := {"id": id, "term": id, "object": true}

_codes(text, citations) := {v.code |
	some v in claims.violations with input as {
		"sentences": [_sentence(text, citations)],
		"references": _refs,
		"matrix": _rows,
	}
}

test_clean_sentence_has_no_violation if {
	count(_codes("ckptgate reads headers before anything is loaded.", [])) == 0
}

test_violation_is_object_with_location if {
	some v in claims.violations with input as {
		"sentences": [_sentence("See [R99].", ["R99"])],
		"references": _refs,
		"matrix": [],
	}
	v.code == "claims_unknown_citation"
	v.location == {"file": "docs/x.md", "line": 3}
	v.evidence.citations == ["R99"]
	contains(v.message, "R99")
	v.evidence.text == "See [R99]."
}

test_rule1_vendor_without_documents_verb if {
	"claims_vendor_phrasing" in _codes("DCP saves multi-rank state [R01].", ["R01"])
}

test_rule1_vendor_with_documents_verb if {
	count(_codes("PyTorch documents DCP load-time resharding [R01].", ["R01"])) == 0
}

test_rule1_vendor_currently_implements if {
	count(_codes("The safetensors library currently implements strict offsets [R11].", ["R11"])) == 0
}

test_rule1_vendor_documentation_as_support if {
	c1 := _clause({"vendor_phrasing": true})
	c2 := _clause({
		"connective": "so",
		"systems": [_mention("hf-sharded-safetensors")],
		"capability": [_cap("support", false, "project")],
	})
	"claims_vendor_as_support" in _fact_codes("x [R01].", ["R01"], [c1, c2], [])
}

test_rule1_vendor_negative_reason_is_not_support if {
	c1 := _clause({"systems": [_mention("hf-sharded-safetensors")], "capability": [_cap("accept", false, "project")]})
	c2 := _clause({"connective": "because", "vendor_phrasing": true, "negation": true})
	codes := _fact_codes("x documents no guarantee [R01].", ["R01"], [c1, c2], [])
	not "claims_vendor_as_support" in codes
}

test_rule1_mixed_citations_not_vendor_rule if {
	count(_codes("weights_only=True is never treated as sufficient trust [R17, R27].", ["R17", "R27"])) == 0
}

test_rule1_register_pointer_not_vendor_rule if {
	count(_codes("Source IDs such as [R01] refer to docs/references.md.", ["R01"])) == 0
}

test_rule1_security_source_not_vendor_rule if {
	count(_codes("A pickle is a program [R27].", ["R27"])) == 0
}

test_rule2_device_map_unmarked if {
	"claims_unmarked_interpretation" in _codes("device_map is checkpoint topology.", [])
}

test_rule2_device_map_marked if {
	codes := _codes("In our interpretation device_map places modules in one process and is not rank topology.", [])
	count(codes) == 0
}

test_rule3_capability_claim_without_row if {
	c := _clause({"systems": [_mention("zero-1")], "capability": [_cap("handle", false, "project")]})
	"claims_support_not_in_matrix" in _fact_codes("ckptgate handles ZeRO-1.", [], [c], [])
}

test_rule3_capability_claim_for_unqualified_row if {
	c := _clause({"systems": [_mention("dcp")], "capability": [_cap("read", false, "implicit")]})
	"claims_support_not_in_matrix" in _fact_codes("DCP is read.", [], [c], [])
}

test_rule3_capability_claim_with_supported_row if {
	c := _clause({"systems": [_mention("hf-sharded-safetensors")], "capability": [_cap("support", false, "project")]})
	count(_fact_codes("ckptgate supports hf sharded safetensors.", [], [c], [])) == 0
}

test_rule3_family_needs_matrix_scope if {
	c := _clause({"systems": [_mention("deepspeed")], "capability": [_cap("consolidate", false, "project")]})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [c], [])
	scoped := object.union(c, {"scope": ["support matrix"]})
	count(_fact_codes("x", [], [scoped], [])) == 0
}

test_rule3_variant_without_row_even_with_scope if {
	c := _clause({
		"systems": [_mention("fsdp2")],
		"capability": [_cap("read", false, "project")],
		"scope": ["support matrix"],
	})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [c], [])
}

test_rule3_universal_claim if {
	c := _clause({
		"systems": [_mention("hf-sharded-safetensors")],
		"capability": [_cap("handle", false, "project")],
		"universal": ["any topology"],
	})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [c], [])
}

test_rule3_versions if {
	open := _clause({
		"capability": [_cap("read", false, "project")],
		"versions": [{"producer": "huggingface_hub", "version": "2.4", "open": true, "term": "hub 2.4+"}],
	})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [open], [])
	exact := _clause({
		"capability": [_cap("read", false, "project")],
		"versions": [{"producer": "huggingface_hub", "version": "2.4", "open": false, "term": "hub 2.4"}],
	})
	count(_fact_codes("x", [], [exact], [])) == 0
	other := _clause({
		"capability": [_cap("read", false, "project")],
		"versions": [{"producer": "huggingface_hub", "version": "1.0", "open": false, "term": "hub 1.0"}],
	})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [other], [])
}

test_rule3_negated_vendor_and_hypothetical_claims_pass if {
	neg := _clause({"systems": [_mention("zero-1")], "capability": [_cap("support", true, "project")]})
	vendor := _clause({"systems": [_mention("zero-1")], "capability": [_cap("consolidate", false, "vendor")]})
	hypo := _clause({
		"systems": [_mention("zero-1")],
		"capability": [_cap("support", false, "implicit")],
		"hypothetical": true,
	})
	count(_fact_codes("x", [], [neg, vendor, hypo], [])) == 0
}

test_rule3_an_unanswered_question_passes_and_an_affirmed_one_fails if {
	asked := {"systems": [_mention("zero-1")], "capability": [_cap("support", false, "project")]}
	count(_fact_codes("x", [], [_clause(object.union(asked, {"question": true}))], [])) == 0
	"claims_support_not_in_matrix" in _fact_codes("x", [], [_clause(asked)], [])
}

test_rule3_tools_and_instrument_frameworks_are_not_claims if {
	tool := _clause({"systems": [_mention("zero_to_fp32")], "capability": [_cap("consolidate", false, "project")]})
	fw := _clause({
		"systems": [{"id": "pytorch", "term": "torch", "object": false}],
		"capability": [_cap("read", false, "project")],
	})
	count(_fact_codes("x", [], [tool, fw], [])) == 0
	obj := _clause({"systems": [_mention("pytorch")], "capability": [_cap("work_with", false, "project")]})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [obj], [])
}

_entity(term, kind, number) := {"term": term, "kind": kind, "number": number}

_sized_rows := array.concat(_rows, [{
	"format": "fsdp-full", "adapter": "fsdp-full", "status": "supported",
	"topology": {"world_size": 2},
}])

_violations_with(clauses, rows, source) := {v |
	some v in claims.violations with input as {
		"sentences": [object.union(_sentence("x", []), {"facts": _facts(clauses, [])})],
		"references": _refs, "matrix": rows, "matrix_source": source,
	}
}

_feature(obj, negated) := {
	"term": "checks", "object": obj, "negated": negated,
	"agent": "project", "subject": "ckptgate",
}

# The closed world (#35): an unknown name, a platform or a scale in ckptgate's capability claim is an
# error, unless a declared fact or a supported row's topology backs it.
test_closed_world_unknown_name_platform_and_scale_are_errors if {
	every e in [
		_entity("Frobnicator", "name", null),
		_entity("macOS", "platform", null),
		_entity("64 nodes", "count", 64),
	] {
		c := _clause({"capability": [_cap("run_on", false, "project")], "entities": [e]})
		some v in _violations_with([c], _sized_rows, {"name": "repo", "path": "matrix/support.json"})
		v.code == "claims_support_not_in_matrix"
		v.severity == "error"
		contains(v.message, e.term)
	}
}

test_closed_world_declared_fact_and_matrix_scale_are_backed if {
	linux := _clause({"capability": [_cap("run_on", false, "project")], "entities": [_entity("Linux", "name", null)]})
	ranks := _clause({"capability": [_cap("run_on", false, "project")], "entities": [_entity("2 ranks", "count", 2)]})
	count(_violations_with([linux, ranks], _sized_rows, {"name": "repo", "path": "matrix/support.json"})) == 0
	more := _clause({"capability": [_cap("run_on", false, "project")], "entities": [_entity("8 ranks", "count", 8)]})
	some v in _violations_with([more], _sized_rows, {"name": "repo", "path": "matrix/support.json"})
	v.code == "claims_support_not_in_matrix"
}

test_closed_world_consumer_negated_and_scoped_entities_are_clean if {
	mac := [_entity("macOS", "platform", null)]
	consumer := _clause({"capability": [_cap("support", false, "consumer")], "entities": mac})
	negated := _clause({"capability": [_cap("support", true, "project")], "entities": mac})
	scoped := _clause({
		"capability": [_cap("support", false, "project")], "entities": [_entity("4 ranks", "count", 4)],
		"scope": ["supported rows"],
	})
	count(_violations_with([consumer, negated, scoped], _rows, null)) == 0
}

test_closed_world_universal_needs_scope if {
	c := _clause({"capability": [_cap("support", false, "project")], "universal": ["any world size"]})
	"claims_support_not_in_matrix" in _fact_codes("x", [], [c], [])
	scoped := object.union(c, {"scope": ["support matrix"]})
	count(_fact_codes("x", [], [scoped], [])) == 0
}

# Whose matrix was read is in the message: the repository's own, or that it has none.
test_message_names_whose_matrix_was_read if {
	c := _clause({"capability": [_cap("support", false, "project")], "entities": [_entity("macOS", "platform", null)]})
	some own in _violations_with([c], _rows, {"name": "acme", "path": "matrix/support.json"})
	contains(own.message, "the support matrix read is acme's matrix/support.json, with 1 supported row(s)")
	some none in _violations_with([c], [], {"name": "acme", "path": null})
	contains(none.message, "acme has no support matrix")
}

# Safety conclusions phrased as impossibility or proof are rule 5 errors; about a surrogate, rule 6.
test_impossibility_and_proof_are_safety_conclusions if {
	impossible := _clause({"safety": [_safe("impossible", false)]})
	"claims_containment_as_proof" in _fact_codes("x", [], [impossible], [])
	proof := _clause({"safety": [_safe("proof", false)]})
	"claims_containment_as_proof" in _fact_codes("x", [], [proof], [])
	sur := _clause({"safety": [_safe("impossible", false)], "topics": ["surrogate"]})
	"claims_surrogate_trust" in _fact_codes("x", [], [sur], [])
	count(_fact_codes("x", [], [_clause({"safety": [_safe("proof", true)]})], [])) == 0
}

# A feature named as done must be a listed capability (data.ckptgate.config.claims.capabilities).
test_features_must_be_listed_capabilities if {
	unlisted := _clause({"features": [_feature("certificate revocation", false)]})
	some v in _violations_with([unlisted], _rows, null)
	v.code == "claims_unlisted_capability"
	contains(v.message, "certificate revocation")
	listed := _clause({"features": [_feature("the safetensors header", false)]})
	denied := _clause({"features": [_feature("certificate revocation", true)]})
	vendor := _clause({"features": [object.union(_feature("certificate revocation", false), {"agent": "vendor"})]})
	count(_violations_with([listed, denied, vendor], _rows, null)) == 0
}

test_generated_row_checked_against_matrix if {
	gen := {"file": "matrix/SUPPORT.md", "line": 9, "text": "| supported | ... |", "row": {
		"status": "supported", "adapter": "hf-safetensors", "adapter_version": "0.1.0",
		"format": ["hf-sharded-safetensors"], "fixture": "sha256:ab",
	}}
	rows := [{
		"format": ["hf-sharded-safetensors"],
		"adapter": "hf-safetensors",
		"adapter_version": "0.1.0",
		"fixture_digest": "sha256:abcd",
		"status": "supported",
	}]
	count(claims.violations) == 0 with input as {"sentences": [], "references": [], "matrix": rows, "generated": [gen]}
	forged := object.union(gen, {"row": object.union(gen.row, {"adapter": "dcp"})})
	some v in claims.violations with input as {"sentences": [], "references": [], "matrix": rows, "generated": [forged]}
	v.code == "claims_generated_mismatch"
}

test_rule4_archived_link_not_historical if {
	"claims_archived_not_historical" in _codes("See https://pytorch.org/docs/2.1/dcp.html for the format.", [])
}

test_rule4_archived_link_historical if {
	count(_codes("https://pytorch.org/docs/2.1/dcp.html is historical evidence only.", [])) == 0
}

test_rule5_containment_as_proof if {
	c := _clause({"safety": [_safe("harm", false)], "topics": ["containment", "loader"]})
	"claims_containment_as_proof" in _fact_codes("A pickle cannot harm the host in the worker.", [], [c], [])
}

test_rule5_bounded if {
	c := _clause({"safety": [_safe("proof", true), _safe("inherent", true)], "topics": ["containment"]})
	count(_fact_codes("Containment does not prove the load is safe.", [], [c], [])) == 0
}

test_rule5_shield_needs_a_security_topic if {
	c := _clause({"safety": [_safe("shield", false)], "topics": []})
	count(_fact_codes("x", [], [c], [])) == 0
	"claims_containment_as_proof" in _fact_codes("x", [], [object.union(c, {"topics": ["containment"]})], [])
}

test_rule6_surrogate_called_safe if {
	c := _clause({"safety": [_safe("inherent", false)], "topics": ["surrogate"]})
	"claims_surrogate_trust" in _fact_codes("weights_only=True is safe.", [], [c], [])
}

test_rule6_trust_needs_a_surrogate if {
	c := _clause({"safety": [_safe("trust", false)], "topics": ["signature"]})
	count(_fact_codes("A signer is trusted for qualification.", [], [c], [])) == 0
	"claims_surrogate_trust" in _fact_codes("x", [], [object.union(c, {"topics": ["surrogate"]})], [])
}

test_rule6_bounded if {
	c := _clause({"safety": [_safe("trust", true)], "topics": ["surrogate"]})
	count(_fact_codes("weights_only=True is never treated as sufficient trust [R27].", ["R27"], [c], [])) == 0
}

test_rule7_portable_sandbox if {
	c := _clause({"cross_platform": ["macOS"], "topics": ["os_control"]})
	"claims_portable_sandbox" in _fact_codes("seccomp works on macOS.", [], [c], ["os_control"])
}

test_rule7_exact_profile if {
	neg := _clause({"cross_platform": ["portable"], "cross_platform_negated": true, "topics": ["os_control"]})
	bound := _clause({"cross_platform": ["other platforms"], "platform_bounds": ["refuse"], "topics": ["os_control"]})
	count(_fact_codes("x", [], [neg, bound], ["os_control"])) == 0
}

test_unknown_citation if {
	"claims_unknown_citation" in _codes("Offsets are half-open [R11, R99].", ["R11", "R99"])
}

test_known_citations if {
	count(_codes("Safetensors defines half-open offsets [R11].", ["R11"])) == 0
}

test_no_sentences_no_violations if {
	count(claims.violations) == 0 with input as {"sentences": [], "references": [], "matrix": []}
}
