# Training provenance in ckptgate.intake: a training job's SLSA Provenance v1 statement (buildType
# https://ckptgate.dev/training/v1, kinds with gates_producers in the intake data) says what the
# checkpoint is and who produced it; the gate data says whether ckptgate's adapter is qualified
# for that. The statement satisfies a request only when its fixture digest is the measured one,
# its format is the inspected one, the topology it declares agrees with what the layout records
# (input.inspection.topology), Python bound every measured file to a subject (binding "manifest":
# a subject equal to the fixture digest binds no file) and, when the classes need a producer-version gate, the producer
# versions it records pass the gate of the format's adapter. Its signer's builder id scope is
# ckptgate.trust's to check.
package ckptgate.intake

import data.ckptgate.gates

# METADATA
# scope: document
# description: >-
#   True when the gate data says adapter was qualified on producer at version: the one place
#   the training rules read the producer-version gate (data.ckptgate.config.gates).
default _release_gated(_, _, _) := false

# the one place training provenance reads the producer gate (#31's generated qualified rows, via
# ckptgate.gates): the release at the topology the statement records
_release_gated(att, producer, version) if {
	gates.passes({"name": producer, "version": version}, gate, _format, _training_topology(att))
}

_training_topology(att) := t if {
	t := _internal(att).topology
	is_object(t)
} else := null

_is_training(att) if _predicate_cfg(att).gates_producers == true

_internal(att) := object.get(att, ["statement", "predicate", "buildDefinition", "internalParameters"], {})

_producer_deps(att) := [{"name": d.name, "version": d.annotations.version} |
	some d in object.get(att, ["statement", "predicate", "buildDefinition", "resolvedDependencies"], [])
	d.annotations.kind == "producer"
]

# Some recorded producer passes the gate, and every other record of that producer does too (a
# statement naming torch twice, at a qualified and an unqualified version, is not gated).
_training_gated(att) if {
	_is_training(att)
	some dep in _producer_deps(att)
	_release_gated(att, dep.name, dep.version)
	every other in _producer_deps(att) {
		_same_or_gated(att, other, dep)
	}
}

_same_or_gated(_, other, dep) if other.name != dep.name

_same_or_gated(att, other, _) if _release_gated(att, other.name, other.version)

_training_problems(att) := {code |
	some code, failed in {
		"training_digest_mismatch": _internal(att).fixture_digest != input.fixture.digest,
		"training_format_mismatch": _internal(att).format != _format,
		"training_topology_contradicts_layout": count(_topology_contradictions(att)) > 0,
		"training_not_bound_per_file": object.get(att, ["verification", "binding"], null) != "manifest",
	}
	failed
}

_topology_contradictions(att) := {field: {"declared": declared, "measured": measured} |
	some field, measured in object.get(input, ["inspection", "topology"], {})
	declared := object.get(_internal(att), ["topology", field], null)
	declared != null
	not declared in measured
}

_training_holds(att) if not _is_training(att)

_training_holds(att) if {
	_is_training(att)
	count(_training_problems(att)) == 0
}

_training_messages := {
	"training_digest_mismatch": "its internalParameters.fixture_digest %v is not the measured fixture digest %v",
	"training_format_mismatch": "it says it wrote format %v, but the checkpoint is %v",
	"training_topology_contradicts_layout": "the topology it declares contradicts what the layout records: %v",
	"training_not_bound_per_file": "its subjects were not bound file by file to the checkpoint (binding %v)",
}

_training_args(att, "training_digest_mismatch") := [_internal(att).fixture_digest, input.fixture.digest]

_training_args(att, "training_format_mismatch") := [_internal(att).format, _format]

_training_args(att, "training_topology_contradicts_layout") := [_topology_contradictions(att)]

_training_args(att, "training_not_bound_per_file") := [object.get(att, ["verification", "binding"], null)]

deny_reasons contains reason if {
	not requirement_met
	some i in _candidates
	att := input.attestations[i]
	_is_training(att)
	some code in _training_problems(att)
	args := _training_args(att, code)
	reason := _reason(
		code,
		sprintf("training provenance %v: %v", [_source(i), sprintf(_training_messages[code], args)]),
		{
			"attestation": i,
			"declared": {
				"fixture_digest": _internal(att).fixture_digest,
				"format": _internal(att).format,
				"topology": object.get(_internal(att), "topology", {}),
			},
			"measured": {
				"fixture_digest": object.get(input, ["fixture", "digest"], null),
				"format": _format,
				"topology": object.get(input, ["inspection", "topology"], {}),
			},
		},
	)
}

deny_reasons contains reason if {
	not requirement_met
	some i in _candidates
	att := input.attestations[i]
	_is_training(att)
	not _gated(att)
	reason := _reason(
		"training_producer_not_gated",
		sprintf(
			concat(" ", [
				"training provenance %v records producers %v;",
				"no passing qualification of adapter %v covers them (the gate accepts %v)",
			]),
			[_source(i), _producer_deps(att), adapter, gates.describe(gate)],
		),
		{"attestation": i, "producers": _producer_deps(att), "adapter": adapter, "gate": gate},
	)
}
