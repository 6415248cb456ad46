# METADATA
# title: ckptgate.config_test
# description: >-
#   Policy data checks: every data file under policies/ckptgate/config/ matches its JSON
#   Schema under policies/schemas/, and the files agree with each other.
package ckptgate.config_test

_cfg := data.ckptgate.config

test_loaders_data_matches_its_schema if {
	[true, []] == json.match_schema(_cfg.loaders, data.schemas.loaders)
}

test_gates_data_matches_its_schema if {
	[true, []] == json.match_schema(_cfg.gates, data.schemas.gates)
}

test_intake_data_matches_its_schema if {
	[true, []] == json.match_schema(_cfg.intake, data.schemas.intake)
}

test_trust_data_matches_its_schema if {
	[true, []] == json.match_schema(_cfg.trust, data.schemas.trust)
}

test_schema_rejects_a_loader_with_an_unknown_class if {
	bad := json.patch(_cfg.loaders, [{"op": "replace", "path": "/loaders/json/class", "value": "trusted"}])
	json.match_schema(bad, data.schemas.loaders)[0] == false
}

test_schema_rejects_a_gate_with_a_version_range_string if {
	bad := json.patch(_cfg.gates, [{
		"op": "add", "path": "/adapters/dcp/versions",
		"value": {"any": false, "exact": [">=2.9"], "ranges": []},
	}])
	json.match_schema(bad, data.schemas.gates)[0] == false
}

test_schema_rejects_a_version_independent_adapter_without_a_reason if {
	bad := json.patch(_cfg.gates, [{"op": "add", "path": "/adapters/dcp/version_independent", "value": {}}])
	json.match_schema(bad, data.schemas.gates)[0] == false
}

test_generated_gate_matches_its_schema if {
	[true, []] == json.match_schema(_cfg.qualified, data.schemas.qualified)
}

test_generated_gate_names_only_adapters_and_formats_of_the_gates_data if {
	every name, adapter in _cfg.qualified.adapters {
		adapter.producer == _cfg.gates.adapters[name].producer
		every row in adapter.rows {
			_cfg.gates.formats[row.format].adapter == name
		}
	}
}

test_every_loader_class_is_ranked_and_described if {
	every loader in _cfg.loaders.loaders {
		loader.class in _cfg.loaders.risk_order
		_cfg.loaders.classes[loader.class]
	}
}

test_required_and_optional_controls_are_disjoint_and_described if {
	every class in _cfg.loaders.classes {
		every control in array.concat(class.required_controls, class.optional_controls) {
			_cfg.loaders.controls[control]
		}
		{c | some c in class.required_controls} & {c | some c in class.optional_controls} == set()
	}
}

test_cgroup_v2_is_optional_by_default if {
	"cgroup_v2" in _cfg.loaders.classes.framework.optional_controls
	not "cgroup_v2" in _cfg.loaders.require_optional_controls
}

test_framework_needs_attestation_gate_and_containment if {
	needed := {"trusted_attestation", "producer_version_gate", "containment"}
	needed - {e | some e in _cfg.loaders.classes.framework.evidence} == set()
}

test_pure_data_needs_no_attestation if {
	_cfg.loaders.classes.pure_data.evidence == ["clean_inspection"]
}

test_intake_requires_an_attestation_for_every_plane if {
	_cfg.intake.actions.intake.attestation_required == true

	# the framework plane takes ckptgate's own qualification, or a training job's provenance, whose
	# producer versions the adapter's gate must pass (ckptgate.intake, training.rego)
	_cfg.intake.actions.intake.accepted_predicates.framework == ["qualification", "training_provenance"]
	_cfg.intake.predicates.training_provenance.gates_producers == true
	every kinds in _cfg.intake.actions.intake.accepted_predicates {
		count(kinds) > 0
	}
}

test_every_accepted_predicate_kind_is_defined if {
	every action in _cfg.intake.actions {
		every kinds in action.accepted_predicates {
			every kind in kinds {
				_cfg.intake.predicates[kind].type
			}
		}
	}
}
