# METADATA
# title: ckptgate.support
# description: >-
#   Turns every qualification attestation into a support-matrix row with a status:
#   supported, stale (qualified at another candidate commit, or expired), unqualified
#   (evidence incomplete, version not gated, or the candidate commit not established) or
#   refused (result failed, retained result missing or changed, signer untrusted, statement
#   malformed or not yet valid, or naming an evidence commit). Claim rule 3: a row gets the
#   status supported only with an exact producer version, adapter version, immutable fixture
#   digest, candidate commit, environment, topology and a retained result (evidence digest and
#   location, whose file holds those bytes) at the exact candidate commit.
#
#   The candidate commit: walking first parents back from HEAD, the oldest commit whose tree,
#   outside attestations/ and matrix/, equals HEAD's. The commits after it change only
#   attestations/ and matrix/ and are evidence commits; an evidence commit cannot name itself,
#   so an attestation that names an evidence commit (or HEAD, when HEAD is one) is refused.
#   Python computes input.head; this policy checks that it is consistent with that definition
#   and that each attestation names exactly input.head.candidate_commit.
#
#   Input: {attestations: [verified facts, each with retained_result: {location, sha256}
#   read by Python], rejected_attestations: [...], now,
#   head: {commit, candidate_commit, source_tree, candidate_source_tree, evidence_commits},
#   targets: [adapter names]}. Every row costs a constant amount of work (linear batches).
#   The retained_result also carries the format its log records (inspected_format), read only
#   from bytes whose sha256 Python computed; a row trusts it only when that digest is the
#   attested one (no result_not_retained).
package ckptgate.support

import data.ckptgate.gates
import data.ckptgate.trust

# METADATA
# description: >-
#   One row per qualification attestation (input order), then one per rejected attestation,
#   then one unqualified row per target adapter that has no supported row.
# entrypoint: true
rows := array.concat(array.concat(attestation_rows, rejected_rows), target_rows)

# METADATA
# description: Row counts per status.
# entrypoint: true
summary[status] := count([1 | some row in rows; row.status == status]) if {
	some status in ["supported", "stale", "unqualified", "refused"]
}

# METADATA
# description: >-
#   The rows of verified qualification attestations: one per attestation, then one per other
#   producer release an attestation names (producer_releases: releases that wrote the very same
#   bytes, each vouched for by a stored fixture-provenance statement).
attestation_rows := array.concat(_primary_rows, _release_rows)

_primary_rows := [row |
	some i, att in _attestations
	trust.at(att, ["statement", "predicateType"]) == _qualification_type
	row := _row(i, att)
]

_release_rows := [row |
	some i, att in _attestations
	trust.at(att, ["statement", "predicateType"]) == _qualification_type
	some release in releases(att)
	row := _release_row(i, att, release)
]

# METADATA
# description: Attestations that are not qualification evidence; they make no row.
ignored contains {"attestation": i, "source": trust.at(att, ["source"]), "predicate_type": t} if {
	some i, att in _attestations
	t := trust.at(att, ["statement", "predicateType"])
	t != _qualification_type
}

# METADATA
# description: Refused rows for attestations whose cryptographic verification failed.
rejected_rows := [row |
	some rejected in object.get(input, "rejected_attestations", [])
	row := object.union(_empty_row, {
		"source": object.get(rejected, "source", null),
		"status": "refused",
		"reasons": [_reason(
			"attestation_rejected",
			sprintf("attestation %v failed verification (%v)", [
				object.get(rejected, "source", null),
				object.get(rejected, "code", null),
			]),
			{"error_code": object.get(rejected, "code", null), "message": object.get(rejected, "message", null)},
		)],
	})
]

# METADATA
# description: Unqualified rows for target adapters without a supported row.
target_rows := [row |
	some adapter in object.get(input, "targets", [])
	not adapter in _supported_adapters
	row := object.union(_empty_row, {
		"adapter": adapter,
		"format": object.get(_formats_by_adapter, adapter, []),
		"status": "unqualified",
		"reasons": [_reason(
			"no_supported_attestation",
			sprintf("adapter %v has no supported qualification at candidate commit %v", [adapter, _candidate]),
			{"adapter": adapter, "candidate_commit": _candidate},
		)],
	})
]

# METADATA
# description: >-
#   The generated gate (data.ckptgate.config.qualified, written by `ckptgate matrix build`):
#   per adapter, one row per passing qualification with retained evidence, naming its format
#   (the retained result's inspected format), producer release, topology, fixture, attestation
#   and evidence. A qualification counts when it has no problem but one at another candidate
#   commit (code changed since: the matrix row is stale, the release stays qualified until a
#   requalification fails and supersedes it). Never from rows marked supported: a row is
#   unqualified when the gate refuses it, so that could never admit a new release.
# entrypoint: true
qualified := {
	"adapters": {adapter: _qualified_adapter(adapter) |
		some adapter, _ in data.ckptgate.config.gates.adapters
	},
	"hf_mapping": {"qualified": sort(_hf_mapping_rows)},
}

# The check a mapping qualification signs (a logits-parity qualification of intake --hf-config):
# such a statement qualifies a (family, release, topology) row of the mapping, never the adapter's
# name-preserving reading.
_logits_check := "logits_parity_1e-4_fp32"

_mapping_qualification(att) if _logits_check in _p(att, ["result", "checks_run"])

# METADATA
# description: >-
#   A qualification run with ckptgate in a farm runtime environment (issue #31 item 2): its
#   environment names the runtime lock. It makes its own matrix row (the runtime torch is in the
#   environment column) but no gate row: the gate is the producer release gate, and the same
#   fixture's qualification in ckptgate's own environment is what names its release there.
runtime_qualification(att) if is_object(_p(att, ["environment", "runtime"]))

# METADATA
# description: >-
#   The generated Megatron -> Hugging Face mapping rows (data.ckptgate.config.qualified.hf_mapping,
#   read by ckptgate.intake's hfmapping.rego): one per passing mapping qualification with retained
#   evidence, its family read from that evidence (the retained log whose sha256 is the attested
#   one), its release and topology from the signed statement.
# scope: document
_hf_mapping_rows contains row if {
	some i, att in _attestations
	trust.at(att, ["statement", "predicateType"]) == _qualification_type
	_mapping_qualification(att)
	not runtime_qualification(att)
	problems := trust.problems(i, att, _context, _config) | qualification_problems(i, att)
	every problem in problems {
		problem.code in _gate_tolerated
	}
	mapping := object.get(att, ["retained_result", "mapping"], null)
	is_string(mapping.family)
	topology := _p(att, ["topology"])
	row := {
		"family": mapping.family,
		"release": _p(att, ["producer", "version"]),
		"tp": object.get(topology, "tp", 1),
		"pp": object.get(topology, "pp", 1),
		"ep": object.get(topology, "ep", 1),
		"checks_run": _p(att, ["result", "checks_run"]),
		"max_abs_delta": object.get(mapping, "max_abs_delta", null),
		"fixture_digest": _p(att, ["fixture", "digest"]),
		"attestation": trust.at(att, ["source"]),
		"evidence": _p(att, ["result", "evidence", "location"]),
	}
}

# The part of a gate row that a qualification gives every release it names, by attestation index.
_gate_base[i] := {
	"adapter": adapter,
	"format": fmt,
	"topology": _p(att, ["topology"]),
	"fixture_digest": _p(att, ["fixture", "digest"]),
	"attestation": trust.at(att, ["source"]),
	"evidence": _p(att, ["result", "evidence", "location"]),
	"gate_producer": g.producer,
} if {
	some i, att in _attestations
	trust.at(att, ["statement", "predicateType"]) == _qualification_type
	not _mapping_qualification(att)
	not runtime_qualification(att)
	problems := trust.problems(i, att, _context, _config) | qualification_problems(i, att)
	every problem in problems {
		problem.code in _gate_tolerated
	}
	adapter := _p(att, ["adapter", "name"])
	g := data.ckptgate.config.gates.adapters[adapter]
	fmt := object.get(att, ["retained_result", "format"], null)
	data.ckptgate.config.gates.formats[fmt].adapter == adapter
}

_qualified_adapter(adapter) := {
	"producer": g.producer,
	"versions": {row.format: sort({r.producer_version | some r in rows; r.format == row.format}) |
		some row in rows
	},
	"rows": rows,
} if {
	g := data.ckptgate.config.gates.adapters[adapter]
	rows := sort([object.remove(row, ["adapter"]) | some row in _gate_rows; row.adapter == adapter])
}

# Problem codes that leave a qualification standing for the gate.
_gate_tolerated := {"attestation_wrong_commit"}

_gate_rows contains row if {
	some i, base in _gate_base
	att := _attestations[i]
	producer := _p(att, ["producer", "name"])
	gates.producer_matches(producer, base.gate_producer)
	row := object.union(object.remove(base, ["gate_producer"]), {
		"producer": producer,
		"producer_version": _p(att, ["producer", "version"]),
	})
}

# A release the qualification names, vouched for by its trusted provenance statement: the same row
# with that release, and the statement that shows it wrote these bytes.
_gate_rows contains row if {
	some i, base in _gate_base
	some release in releases(_attestations[i])
	[base.fixture_digest, release] in vouched
	gates.producer_matches(release.name, base.gate_producer)
	row := object.union(object.remove(base, ["gate_producer"]), {
		"producer": release.name,
		"producer_version": release.version,
		"provenance": release.provenance,
	})
}

_supported_adapters contains row.adapter if {
	some row in attestation_rows
	row.status == "supported"
}

_attestations := object.get(input, "attestations", [])

_qualification_type := data.ckptgate.config.intake.predicates.qualification.type

_candidate := object.get(input, ["head", "candidate_commit"], null)

_formats_by_adapter[adapter] := sort(names) if {
	some f in data.ckptgate.config.gates.formats
	adapter := f.adapter
	is_string(adapter)
	names := {name | some name, g in data.ckptgate.config.gates.formats; g.adapter == adapter}
}

_empty_row := {
	"source": null, "format": [], "adapter": null, "adapter_version": null,
	"producer": null, "producer_version": null, "fixture_digest": null,
	"candidate_commit": null, "environment": null, "topology": null,
	"status": "refused", "reasons": [], "evidence": null,
}

_context := {
	"bind_fixture": false,
	"fixture_digest": null,
	"now_ns": trust.time_ns(object.get(input, "now", null)),
	"candidate_commit": _candidate,
}

_config := {
	"signers": object.get(data.ckptgate.config, ["trust", "signers"], []),
	"intake": data.ckptgate.config.intake,
}

_row(i, att) := {
	"source": trust.at(att, ["source"]),
	"format": object.get(_formats_by_adapter, _p(att, ["adapter", "name"]), []),
	"adapter": _p(att, ["adapter", "name"]),
	"adapter_version": _p(att, ["adapter", "version"]),
	"producer": _p(att, ["producer", "name"]),
	"producer_version": _p(att, ["producer", "version"]),
	"fixture_digest": _p(att, ["fixture", "digest"]),
	"candidate_commit": _p(att, ["candidate_commit"]),
	"environment": _p(att, ["environment"]),
	"topology": _p(att, ["topology"]),
	"status": _status(reasons, status_of),
	"reasons": sort(reasons),
	"evidence": {
		"result": _p(att, ["result", "status"]),
		"digest": _p(att, ["result", "evidence", "digest"]),
		"location": _p(att, ["result", "evidence", "location"]),
		"signers": [s | some signer in object.get(att, "signers", []); s := object.get(signer, "signer_id", null)],
	},
} if {
	reasons := trust.problems(i, att, _context, _config) | row_problems(i, att)
}

_release_row(i, att, release) := object.union(_row(i, att), {
	"producer": release.name,
	"producer_version": release.version,
	"status": _status(reasons, status_of),
	"reasons": sort(reasons),
	"evidence": object.union(_row(i, att).evidence, {
		"provenance": release.provenance,
		"manifest": release.manifest,
	}),
}) if {
	reasons := trust.problems(i, att, _context, _config) | release_problems(i, att, release)
}

default _p(_, _) := null

_p(att, path) := object.get(att.statement.predicate, path, null) if is_object(att.statement.predicate)

# METADATA
# description: The status class of each reason code; an unknown code refuses.
status_of := {
	"attestation_rejected": "refused",
	"attestation_malformed": "refused",
	"attestation_untrusted_signer": "refused",
	"attestation_not_yet_valid": "refused",
	"attestation_digest_mismatch": "refused",
	"attestation_predicate_mismatch": "refused",
	"result_failed": "refused",
	"result_not_retained": "refused",
	"candidate_commit_is_evidence_commit": "refused",
	"attestation_wrong_commit": "stale",
	"attestation_expired": "stale",
	"attestation_freshness_unchecked": "stale",
	"claim_incomplete": "unqualified",
	"producer_release_unqualified": "unqualified",
	"producer_release_unproven": "unqualified",
	"adapter_unknown": "unqualified",
	"candidate_commit_unverified": "unqualified",
	"attestation_unchecked": "refused",
	"no_supported_attestation": "unqualified",
}

_status(reasons, classes) := order[max({0} | {rank |
	some r in reasons
	some rank, status in order
	status == object.get(classes, r.code, "refused")
})] if {
	order := ["supported", "unqualified", "stale", "refused"]
}

_reason(code, message, ev) := {"code": code, "message": message, "evidence": ev}
