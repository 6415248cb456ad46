# The Megatron -> Hugging Face mapping (intake --hf-config), for ckptgate.intake. Python maps
# through the family table and reports input.hf_mapping: the family the config declares, the
# config manifest's sha256 and the tensor-parallel degree the layout shows (the TP split of the
# chunks). The checkpoint does not record its megatron-core release, and pipeline and expert
# parallelism leave no trace once tensors are placed globally, so the release and the topology
# come from the attested provenance (a satisfying attestation's producer and topology), checked
# against the layout. Only the rows that policy data (config/intake/data.json hf_mapping) names
# as qualified are allowed; every other row is denied with its reason.
package ckptgate.intake

_hf_cfg := object.get(_intake_cfg, "hf_mapping", {"producer": "", "qualified": []})

# METADATA
# description: >-
#   The (family, release, tp, pp, ep) rows the satisfying attestations state for this checkpoint,
#   with the family the declared config names.
# scope: document
hf_mapping_rows contains row if {
	is_string(input.hf_mapping.family)
	some i in satisfying_attestations
	pred := input.attestations[i].statement.predicate
	pred.producer.name == _hf_cfg.producer
	is_number(pred.topology.tp)
	row := {
		"family": input.hf_mapping.family,
		"release": pred.producer.version,
		"tp": pred.topology.tp,
		"pp": object.get(pred.topology, "pp", 1),
		"ep": object.get(pred.topology, "ep", 1),
	}
}

_hf_qualified contains row if {
	some row in hf_mapping_rows
	row.tp == input.hf_mapping.layout_tp
	some q in _hf_cfg.qualified
	q.family == row.family
	q.release == row.release
	q.tp == row.tp
	q.pp == row.pp
	q.ep == row.ep
}

deny_reasons contains reason if {
	is_string(input.hf_mapping.family)
	count(hf_mapping_rows) == 0
	reason := _reason(
		"hf_mapping_provenance_unknown",
		sprintf(
			"the %v mapping needs the megatron-core release and topology from a satisfying attestation by %v; none states them",
			[input.hf_mapping.family, _hf_cfg.producer],
		),
		{"family": input.hf_mapping.family, "producer": _hf_cfg.producer},
	)
}

deny_reasons contains reason if {
	some row in hf_mapping_rows
	row.tp != input.hf_mapping.layout_tp
	reason := _reason(
		"hf_mapping_topology_mismatch",
		sprintf("the attestation states tp=%v; the checkpoint's layout shows tp=%v", [row.tp, input.hf_mapping.layout_tp]),
		{"attested": row, "layout_tp": input.hf_mapping.layout_tp},
	)
}

deny_reasons contains reason if {
	count(hf_mapping_rows) > 0
	count(_hf_qualified) == 0
	reason := _reason(
		"hf_mapping_not_qualified",
		sprintf(
			"no attested row of the %v mapping is qualified in policy data (hf_mapping.qualified)",
			[input.hf_mapping.family],
		),
		{"rows": hf_mapping_rows, "qualified": _hf_cfg.qualified},
	)
}
