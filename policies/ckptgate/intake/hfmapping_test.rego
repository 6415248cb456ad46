# Tests of ckptgate.intake's Megatron -> Hugging Face mapping rows (hfmapping.rego): the rows the
# satisfying attestations state, checked against the layout's tensor-parallel degree and against
# the qualified rows of policy data.
package ckptgate.intake_test

import data.ckptgate.intake

_hf_qualified_row := {"family": "llama", "release": "0.16.1", "tp": 2, "pp": 1, "ep": 1}

_hf_qualified_cfg := {"qualified": [_hf_qualified_row]}

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
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
	codes := {r.code | some r in reasons}
}

_hf_codes := {"hf_mapping_provenance_unknown", "hf_mapping_topology_mismatch", "hf_mapping_not_qualified"}

test_a_qualified_row_matching_the_layout_is_not_denied if {
	codes := _hf_deny_codes(_hf_input({"tp": 2, "pp": 1, "ep": 1}, 2))
	count(codes & _hf_codes) == 0
}

test_a_tensor_parallel_degree_the_layout_contradicts_is_denied if {
	codes := _hf_deny_codes(_hf_input({"tp": 4, "pp": 1, "ep": 1}, 2))
	"hf_mapping_topology_mismatch" in codes
	"hf_mapping_not_qualified" in codes
}

test_a_row_policy_data_does_not_name_is_denied if {
	codes := _hf_deny_codes(_hf_input({"tp": 2, "pp": 2, "ep": 1}, 2))
	codes & _hf_codes == {"hf_mapping_not_qualified"}
}

test_an_attestation_stating_no_topology_leaves_the_provenance_unknown if {
	codes := _hf_deny_codes(_hf_input({}, 2))
	codes & _hf_codes == {"hf_mapping_provenance_unknown"}
}

test_a_row_needs_pp_and_ep_stated if {
	# parallelism a statement leaves out is unknown, never 1: a pp=2 job attested as {"tp": 2}
	# would otherwise pass as the qualified pp=1 row
	rows := intake.hf_mapping_rows with input as _hf_input({"tp": 2}, 2)
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
	rows == set()
	codes := _hf_deny_codes(_hf_input({"tp": 2, "pp": 1}, 2))
	codes & _hf_codes == {"hf_mapping_provenance_unknown"}
}

test_rows_read_the_stated_topology if {
	rows := intake.hf_mapping_rows with input as _hf_input({"tp": 2, "pp": 1, "ep": 1}, 2)
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
	rows == {{"family": "llama", "release": "0.16.1", "tp": 2, "pp": 1, "ep": 1}}
}

# Training provenance (#32): the producer among resolvedDependencies, the topology in
# internalParameters, as `ckptgate attest checkpoint` writes them.
_hf_training_input(deps, topology) := {
	"hf_mapping": {"family": "llama", "layout_tp": 2},
	"attestations": [{"statement": {
		"predicateType": "https://slsa.dev/provenance/v1",
		"predicate": {"buildDefinition": {
			"buildType": "https://ckptgate.dev/training/v1",
			"internalParameters": {"topology": topology},
			"resolvedDependencies": [{"name": n, "annotations": {"kind": "producer", "version": v}} |
				some [n, v] in deps
			],
		}},
	}}],
}

_hf_training_codes(inp) := codes if {
	reasons := intake.deny_reasons with input as inp
		with intake.satisfying_attestations as {0}
		with intake._is_training as true
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
	codes := {r.code | some r in reasons} & _hf_codes
}

test_training_provenance_states_a_row if {
	inp := _hf_training_input([["torch", "2.10.0"], ["megatron-core", "0.16.1"]], {"tp": 2, "pp": 1, "ep": 1})
	rows := intake.hf_mapping_rows with input as inp
		with intake.satisfying_attestations as {0}
		with intake._is_training as true
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
	rows == {{"family": "llama", "release": "0.16.1", "tp": 2, "pp": 1, "ep": 1}}
	count(_hf_training_codes(inp)) == 0
}

test_training_provenance_of_an_unqualified_row_is_denied if {
	inp := _hf_training_input([["megatron-core", "0.16.1"]], {"tp": 2, "pp": 2, "ep": 1})
	_hf_training_codes(inp) == {"hf_mapping_not_qualified"}
}

test_training_provenance_with_two_releases_or_none_states_no_row if {
	two := _hf_training_input([["megatron-core", "0.16.1"], ["megatron-core", "0.19.2"]], {"tp": 2, "pp": 1, "ep": 1})
	_hf_training_codes(two) == {"hf_mapping_provenance_unknown"}
	none := _hf_training_input([["torch", "2.10.0"]], {"tp": 2, "pp": 1, "ep": 1})
	_hf_training_codes(none) == {"hf_mapping_provenance_unknown"}
	no_ep := _hf_training_input([["megatron-core", "0.16.1"]], {"tp": 2, "pp": 1})
	_hf_training_codes(no_ep) == {"hf_mapping_provenance_unknown"}
}

test_the_decision_says_what_is_declared_not_measured if {
	inp := object.union(_hf_input({"tp": 2, "pp": 1, "ep": 1}, 2), {"hf_mapping": {
		"family": "llama", "layout_tp": 2, "config_sha256": "sha256:ab",
		"declared_not_measured": ["rope_theta", "vocab_size (30): embedding rows at or beyond it are dropped"],
	}})
	infos := intake.info_reasons with input as inp
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
	some r in infos
	r.code == "hf_mapping_declared_not_measured"
	contains(r.message, "declared, not measured: rope_theta; vocab_size (30)")
	contains(r.message, "sha256:ab")
}

_hf_sha_declared := "sha256:abababababababababababababababababababababababababababababababab"

_hf_sha_other := "sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"

_hf_config_codes_of := {"hf_config_not_attested", "hf_config_contradicts_attestation"}

_hf_config_input(attested) := {
	"hf_mapping": {"family": "llama", "layout_tp": 2, "config_sha256": _hf_sha_declared},
	"attestations": [{"statement": {"predicate": {"buildDefinition": {"internalParameters": attested}}}}],
}

_hf_config_codes(inp, required) := codes if {
	reasons := intake.deny_reasons with input as inp
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.qualified.hf_mapping as _hf_qualified_cfg
		with data.ckptgate.config.intake.hf_mapping as {"producer": "megatron-core", "require_attested_config": required}
	codes := {r.code | some r in reasons} & _hf_config_codes_of
}

test_the_attested_config_satisfies_the_requirement if {
	count(_hf_config_codes(_hf_config_input({"hf_config_manifest_sha256": _hf_sha_declared}), true)) == 0
}

test_a_declared_config_no_attestation_names_is_denied_only_when_required if {
	_hf_config_codes(_hf_config_input({}), true) == {"hf_config_not_attested"}
	count(_hf_config_codes(_hf_config_input({}), false)) == 0
}

test_a_declared_config_other_than_the_attested_one_is_denied_required_or_not if {
	other := _hf_config_input({"hf_config_manifest_sha256": _hf_sha_other})
	_hf_config_codes(other, true) == {"hf_config_contradicts_attestation"}
	_hf_config_codes(other, false) == {"hf_config_contradicts_attestation"}
}

_hf_moe_row := {"family": "mixtral", "release": "0.16.1", "tp": 1, "pp": 1, "ep": 2}

_hf_moe_cfg := {"qualified": [_hf_moe_row]}

_hf_moe_input(topology, layout_ep) := {
	"hf_mapping": {"family": "mixtral", "layout_tp": 1, "layout_ep": layout_ep},
	"attestations": [{"statement": {"predicate": {
		"producer": {"name": "megatron-core", "version": "0.16.1"},
		"topology": topology,
	}}}],
}

_hf_moe_codes(inp) := {r.code | some r in reasons} if {
	reasons := intake.deny_reasons with input as inp
		with intake.satisfying_attestations as {0}
		with data.ckptgate.config.qualified.hf_mapping as _hf_moe_cfg
}

test_an_expert_parallel_degree_the_layout_shows_is_allowed if {
	codes := _hf_moe_codes(_hf_moe_input({"tp": 1, "pp": 1, "ep": 2}, 2))
	count(codes & _hf_codes) == 0
}

test_an_expert_parallel_degree_the_layout_contradicts_is_denied if {
	codes := _hf_moe_codes(_hf_moe_input({"tp": 1, "pp": 1, "ep": 4}, 2))
	"hf_mapping_topology_mismatch" in codes
	"hf_mapping_not_qualified" in codes
}

test_a_qualified_mapping_row_passes_the_producer_gate if {
	inp := _hf_moe_input({"tp": 1, "pp": 1, "ep": 2}, 2)
	intake._hf_gated(inp.attestations[0]) with input as inp
		with data.ckptgate.config.qualified.hf_mapping as _hf_moe_cfg
}

test_an_unqualified_mapping_row_does_not_pass_the_producer_gate_by_itself if {
	inp := _hf_moe_input({"tp": 1, "pp": 1, "ep": 4}, 2)
	not intake._hf_gated(inp.attestations[0]) with input as inp
		with data.ckptgate.config.qualified.hf_mapping as _hf_moe_cfg
}
