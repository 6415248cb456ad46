# The attestation requirement of ckptgate.intake: whether this request needs a trusted
# attestation, which predicate types satisfy it, and the reasons when none does.
# Cryptographic failures (input.rejected_attestations) always deny; they are never facts
# that could be allowed.
package ckptgate.intake

import data.ckptgate.gates
import data.ckptgate.trust

# METADATA
# description: >-
#   True unless the action does not require an attestation and no class present needs one
#   (trusted_attestation) or needs a producer version from one (producer_version_gate).
# scope: document
default attestation_required := true

attestation_required := false if {
	action.attestation_required == false
	not "trusted_attestation" in evidence
	not "producer_version_gate" in evidence
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

_gated(_) if not "producer_version_gate" in evidence

_gated(att) if gates.passes(att.statement.predicate.producer, gate)

_gated(att) if _training_gated(att)

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

deny_reasons contains reason if {
	not requirement_met
	some i in _candidates
	_adapter_bound(input.attestations[i])
	not _gated(input.attestations[i])
	producer := input.attestations[i].statement.predicate.producer
	reason := _reason(
		"producer_version_not_gated",
		sprintf("attestation %v says producer %v %v; the gate for adapter %v accepts %v", [
			_source(i), producer.name, producer.version,
			adapter, gates.describe(gate),
		]),
		{"attestation": i, "producer": producer, "adapter": adapter, "gate": gate},
	)
}

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
