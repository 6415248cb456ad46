# Tests of ckptgate.intake's Megatron -> Hugging Face mapping rows (hfmapping.rego): the rows the
# satisfying attestations state, checked against the layout's tensor-parallel degree and against
# the qualified rows of policy data.
package ckptgate.intake_test

import data.ckptgate.intake

_hf_qualified_row := {"family": "llama", "release": "0.16.1", "tp": 2, "pp": 1, "ep": 1}

_hf_qualified_cfg := {"producer": "megatron-core", "qualified": [_hf_qualified_row]}

_hf_input(topology, layout_tp) := {
	"hf_mapping": {"family": "llama", "layout_tp": layout_tp},
	"attestations": [{"statement": {"predicate": {
		"producer": {"name": "megatron-core", "version": "0.16.1"},
		"topology": topology,
	}}}],
}

_hf_deny_codes(inp) := codes if {
	reasons := intake.deny_reasons with input as inp
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.intake.hf_mapping as _hf_qualified_cfg
	codes := {r.code | some r in reasons}
}

_hf_codes := {"hf_mapping_provenance_unknown", "hf_mapping_topology_mismatch", "hf_mapping_not_qualified"}

test_a_qualified_row_matching_the_layout_is_not_denied if {
	codes := _hf_deny_codes(_hf_input({"tp": 2}, 2))
	count(codes & _hf_codes) == 0
}

test_a_tensor_parallel_degree_the_layout_contradicts_is_denied if {
	codes := _hf_deny_codes(_hf_input({"tp": 4}, 2))
	"hf_mapping_topology_mismatch" in codes
	"hf_mapping_not_qualified" in codes
}

test_a_row_policy_data_does_not_name_is_denied if {
	codes := _hf_deny_codes(_hf_input({"tp": 2, "pp": 2}, 2))
	codes & _hf_codes == {"hf_mapping_not_qualified"}
}

test_an_attestation_stating_no_topology_leaves_the_provenance_unknown if {
	codes := _hf_deny_codes(_hf_input({}, 2))
	codes & _hf_codes == {"hf_mapping_provenance_unknown"}
}

test_rows_default_pp_and_ep_to_one if {
	rows := intake.hf_mapping_rows with input as _hf_input({"tp": 2}, 2)
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.intake.hf_mapping as _hf_qualified_cfg
	rows == {{"family": "llama", "release": "0.16.1", "tp": 2, "pp": 1, "ep": 1}}
}
