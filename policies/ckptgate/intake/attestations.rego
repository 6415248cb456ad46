# The attestation requirement of ckptgate.intake: whether this request needs a trusted
# attestation, which predicate types satisfy it, and the reasons when none does.
# Cryptographic failures (input.rejected_attestations) always deny; they are never facts
# that could be allowed.
package ckptgate.intake

import data.ckptgate.gates
import data.ckptgate.trust

# METADATA
# description: >-
#   True unless the action does not require an attestation, no class present needs one
#   (trusted_attestation) or needs a producer version from one (producer_version_gate), and the
#   adapter's producer gate is not enforced.
# scope: document
default attestation_required := true

attestation_required := false if {
	action.attestation_required == false
	not "trusted_attestation" in evidence
	not "producer_version_gate" in evidence
	not gate_enforced
}

# METADATA
# description: Predicate types that satisfy the requirement for this action and plane.
accepted_predicate_types contains predicate_type if {
	some kind in object.get(action, ["accepted_predicates", plane], [])
	predicate_type := _intake_cfg.predicates[kind].type
}

_accepted_kinds contains kind if some kind in object.get(action, ["accepted_predicates", plane], [])

_candidates contains i if {
	some i in trust.trusted_attestations
	some kind in trust.kinds(input.attestations[i], _intake_cfg.predicates)
	kind in _accepted_kinds
}

# METADATA
# description: >-
#   Indices of trusted attestations of an accepted type that retain a passing result (for
#   predicate types that retain one), are bound to this format's adapter (for predicate types
#   that bind one) and, when the classes need it, pass the producer gate.
satisfying_attestations contains i if {
	some i in _candidates
	_result_passes(input.attestations[i])
	_adapter_bound(input.attestations[i])
	_gated(input.attestations[i])
	_training_holds(input.attestations[i])
}

_predicate_cfg(att) := _intake_cfg.predicates[kind] if {
	kinds := trust.kinds(att, _intake_cfg.predicates)
	count(kinds) == 1
	some kind in kinds
}

_result_passes(att) if _predicate_cfg(att).passing_result == null

_result_passes(att) if att.statement.predicate.result.status == _predicate_cfg(att).passing_result

_adapter_bound(att) if {
	_predicate_cfg(att).binds_adapter == false
}

_adapter_bound(att) if {
	is_string(adapter)
	att.statement.predicate.adapter.name == adapter
}

# METADATA
# description: >-
#   True when the producer-release gate decides this request: the adapter's reading depends on
#   the producer's release (every plane: static DCP and Megatron as much as the framework
#   plane), or the class needs a producer version (producer_version_gate), unless the action
#   says producer_gate false (qualify: qualification is how a release enters the gate).
# scope: document
gate_enforced if {
	_gate_needed
	object.get(action, "producer_gate", true) != false
}

_gate_needed if "producer_version_gate" in evidence

_gate_needed if gates.applies(gate)

_gated(_) if not gate_enforced

_gated(att) if gates.passes(release_of(att), gate, _format, topology_of(att))

_gated(att) if _training_gated(att)

# METADATA
# description: >-
#   The producer release a statement names ({name, version}), read where its predicate kind
#   says (data.ckptgate.config.intake.predicates[kind].release): ckptgate's own predicates name
#   it at producer; SLSA provenance names it among resolvedDependencies as pkg:pypi/NAME@VERSION
#   for the gate's producer (exactly one). null when the statement names none (a Model Signing
#   bundle, per-file SLSA without dependencies): such a statement cannot vouch for a
#   version-volatile adapter alone.
# scope: document
default release_of(_) := null

release_of(att) := {"name": p.name, "version": p.version} if {
	path := _predicate_cfg(att).release.path
	p := object.get(att.statement.predicate, path, null)
	is_string(p.name)
	is_string(p.version)
} else := {"name": name, "version": version} if {
	path := _predicate_cfg(att).release.dependencies
	deps := object.get(att.statement.predicate, path, [])
	is_array(deps)
	named := {[n, v] |
		some dep in deps
		[n, v] := _pypi_purl(dep)
		n == _pypi_name(gate.producer)
	}
	count(named) == 1
	some [_, version] in named
	name := gate.producer
}

_pypi_purl(dep) := [_pypi_name(name), version] if {
	[[_, name, version]] := regex.find_all_string_submatch_n(
		`^pkg:pypi/([A-Za-z0-9._-]+)@([0-9A-Za-z.+!-]+)$`,
		dep.uri, 1,
	)
}

_pypi_name(name) := lower(regex.replace(name, `[-_.]+`, "-"))

# METADATA
# description: >-
#   The topology a statement names (its kind's release.topology path), or null when it names
#   none. Declared by the signer, never measured by ckptgate.
# scope: document
default topology_of(_) := null

topology_of(att) := t if {
	path := _predicate_cfg(att).release.topology
	t := object.get(att.statement.predicate, path, null)
	is_object(t)
}

# METADATA
# description: True when no attestation is required or a satisfying attestation exists.
# scope: document
requirement_met if not attestation_required

requirement_met if count(satisfying_attestations) > 0

deny_reasons contains reason if {
	some rejected in input.rejected_attestations
	source := trust.at(rejected, ["source"])
	code := trust.at(rejected, ["code"])
	reason := _reason(
		"attestation_rejected",
		sprintf("attestation %v failed cryptographic verification (%v): %v", [
			source, code,
			trust.at(rejected, ["message"]),
		]),
		{"source": source, "error_code": code},
	)
}

deny_reasons contains reason if {
	not requirement_met
	digest := object.get(input, ["fixture", "digest"], null)
	verified := count(object.get(input, "attestations", []))
	rejected := count(object.get(input, "rejected_attestations", []))
	trusted := sort(trust.trusted_attestations)
	reason := _reason(
		"attestation_missing",
		concat(" ", [
			sprintf("no trusted attestation of type %v for fixture %v satisfies this request", [_type_words, digest]),
			sprintf(
				"(%d offered: %d failed verification, %d verified, %d trusted)",
				[verified + rejected, rejected, verified, count(trusted)],
			),
		]),
		{
			"accepted_predicate_types": sort(accepted_predicate_types),
			"fixture_digest": digest,
			"offered": verified + rejected,
			"rejected": rejected,
			"trusted": trusted,
		},
	)
}

deny_reasons contains reason if {
	not requirement_met
	some reason in trust.reasons
}

deny_reasons contains reason if {
	not requirement_met
	some i in trust.trusted_attestations
	not i in _candidates
	predicate_type := input.attestations[i].statement.predicateType
	reason := _reason(
		"attestation_wrong_predicate_type",
		sprintf("attestation %v has predicate type %v; this request accepts %v", [_source(i), predicate_type, _type_words]),
		{"attestation": i, "predicate_type": predicate_type},
	)
}

deny_reasons contains reason if {
	not requirement_met
	some i in _candidates
	not _result_passes(input.attestations[i])
	result := trust.at(input.attestations[i], ["statement", "predicate", "result", "status"])
	needed := _predicate_cfg(input.attestations[i]).passing_result
	reason := _reason(
		"attestation_result_not_passed",
		sprintf("attestation %v retains the result %v; this request needs %v", [_source(i), result, needed]),
		{"attestation": i, "result": result, "needed": needed},
	)
}

deny_reasons contains reason if {
	not requirement_met
	some i in _candidates
	not _adapter_bound(input.attestations[i])
	attested := trust.at(input.attestations[i], ["statement", "predicate", "adapter", "name"])
	reason := _reason(
		"attestation_adapter_mismatch",
		sprintf("attestation %v qualifies adapter %v, but format %v needs adapter %v", [
			_source(i), attested,
			_format, adapter,
		]),
		{"attestation": i, "attested_adapter": attested, "adapter": adapter},
	)
}

# The gate's refusals, one per attestation that would otherwise serve: the statement names no
# release, names one that is not qualified, or names a topology no qualified row of that
# release has. Each names the nearest qualified rows.
deny_reasons contains reason if {
	some [i, null, _] in _gate_failures
	reason := _reason(
		"producer_release_missing",
		concat("", [
			sprintf("attestation %v names no %v release, and adapter %v reads %v only from qualified releases (%v); ", [
				_source(i), _producer_words, adapter, _format,
				_qualified_words(null),
			]),
			"a statement that names the release (qualification, fixture provenance, or SLSA provenance listing ",
			sprintf("pkg:pypi/%v@VERSION among its resolvedDependencies) must vouch for it", [_producer_words]),
		]),
		{"attestation": i, "adapter": adapter, "format": _format, "qualified": _nearest(null)},
	)
}

deny_reasons contains reason if {
	some [i, release, _] in _gate_failures
	release != null
	count(gates.qualified_rows(release, gate, _format)) == 0
	reason := _reason(
		"producer_release_unqualified",
		sprintf("%v %v is not a qualified release for adapter %v reading %v (attestation %v); qualified: %v", [
			release.name, release.version, adapter, _format,
			_source(i), _qualified_words(release.version),
		]),
		{
			"attestation": i, "producer": release, "adapter": adapter, "format": _format,
			"nearest_qualified": _nearest(release.version),
		},
	)
}

deny_reasons contains reason if {
	some [i, release, topology] in _gate_failures
	release != null
	count(gates.qualified_rows(release, gate, _format)) > 0
	nearest := gates.nearest_topologies(release, gate, _format, topology)
	reason := _reason(
		"topology_unqualified",
		sprintf(
			"%v %v is qualified for adapter %v reading %v, but not at the attested topology %v (attestation %v); qualified: %v",
			[
				release.name, release.version, adapter, _format,
				gates.describe_topology(topology), _source(i), concat(", ", nearest),
			],
		),
		{
			"attestation": i, "producer": release, "adapter": adapter, "format": _format,
			"topology": topology, "nearest_qualified": nearest,
		},
	)
}

_gate_failures contains [i, release_of(att), topology_of(att)] if {
	not requirement_met
	some i in _candidates
	att := input.attestations[i]
	_adapter_bound(att)
	not _gated(att)
}

default _producer_words := "producer"

_producer_words := gate.producer if is_string(gate.producer)

_nearest(version) := gates.nearest_rows(gate, _format, version) if gate != null

else := []

_qualified_words(version) := concat(", ", _nearest(version)) if {
	count(_nearest(version)) > 0
} else := "none"

info_reasons contains reason if {
	some i in satisfying_attestations
	reason := _reason(
		"attestation_trusted",
		sprintf("attestation %v (predicate type %v) is trusted and satisfies this request", [
			_source(i),
			input.attestations[i].statement.predicateType,
		]),
		{"attestation": i, "signers": input.attestations[i].signers},
	)
}

info_reasons contains reason if {
	requirement_met
	some i, _ in input.attestations
	not i in satisfying_attestations
	reason := _reason(
		"attestation_not_used",
		sprintf("attestation %v was not needed or not usable for this request, so it was not used", [_source(i)]),
		{"attestation": i, "problems": sort({r.code | some r in trust.reasons; r.evidence.attestation == i})},
	)
}

default _type_words := "(none accepted for this action and plane)"

_type_words := concat(" or ", sort(accepted_predicate_types)) if count(accepted_predicate_types) > 0

_source(i) := trust.at(input.attestations[i], ["source"])
