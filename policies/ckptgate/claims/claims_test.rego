# METADATA
# title: ckptgate.claims_test
# description: One passing and one failing sentence for every claim rule.
package ckptgate.claims_test

import data.ckptgate.claims

_refs := ["R01", "R11", "R14", "R17", "R27", "R28", "R30", "R32"]

_rows := [
	{"format": "hf-sharded-safetensors", "adapter": "hf-safetensors", "status": "supported"},
	{"format": "torch-dcp", "adapter": "dcp", "status": "unqualified"},
]

_sentence(text, citations) := {"file": "docs/x.md", "line": 3, "text": text, "citations": citations}

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
	"claims_vendor_as_support" in _codes("PyTorch documents resharding, so ckptgate supports DCP [R01].", ["R01"])
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

test_rule3_support_claim_without_row if {
	"claims_support_not_in_matrix" in _codes("ckptgate supports Megatron torch_dist checkpoints.", [])
}

test_rule3_support_claim_for_unqualified_row if {
	"claims_support_not_in_matrix" in _codes("ckptgate supports torch-dcp checkpoints.", [])
}

test_rule3_support_claim_with_supported_row if {
	count(_codes("ckptgate supports hf sharded safetensors.", [])) == 0
}

test_rule3_support_pointer_to_matrix if {
	count(_codes("Which formats are supported is listed in the support matrix.", [])) == 0
}

test_rule3_negated_support if {
	count(_codes("ckptgate does not support FSDP local state dicts.", [])) == 0
}

test_rule4_archived_link_not_historical if {
	"claims_archived_not_historical" in _codes("See https://pytorch.org/docs/2.1/dcp.html for the format.", [])
}

test_rule4_archived_link_historical if {
	count(_codes("https://pytorch.org/docs/2.1/dcp.html is historical evidence only.", [])) == 0
}

test_rule5_containment_as_proof if {
	"claims_containment_as_proof" in _codes("The seccomp worker proves the load is safe [R32].", ["R32"])
}

test_rule5_containment_bounded if {
	count(_codes("Containment limits what a loader reaches; it is never proof of safety [R28].", ["R28"])) == 0
}

test_rule6_weights_only_sufficient if {
	"claims_surrogate_trust" in _codes("weights_only=True is sufficient to trust a checkpoint.", [])
}

test_rule6_checksum_sufficient if {
	"claims_surrogate_trust" in _codes("A matching checksum is enough to accept the file.", [])
}

test_rule6_bounded if {
	count(_codes("weights_only=True is never treated as sufficient trust [R27].", ["R27"])) == 0
}

test_rule7_portable_sandbox if {
	"claims_portable_sandbox" in _codes("seccomp and cgroups give a portable sandbox.", [])
}

test_rule7_exact_profile if {
	count(_codes("seccomp is an exact-profile mechanism, not a portable sandbox [R32].", ["R32"])) == 0
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
