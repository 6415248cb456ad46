# Claim rule 3 and the candidate-commit definition for ckptgate.support: the problems that
# are specific to a matrix row, beyond the trust checks of ckptgate.trust.
package ckptgate.support

import data.ckptgate.gates
import data.ckptgate.trust

# METADATA
# scope: document
# description: >-
#   Row problems beyond trust: incomplete claim fields, a failed result, a fixture digest
#   that is not the subject, an evidence commit named as candidate, an unverified candidate
#   commit, and producer releases outside the adapter's gate (another producer, or outside a
#   policy-data overlay's restriction).
row_problems(i, att) := {_reason(code, msg, object.union(_ref(i, att), ev)) |
	some [code, msg, ev] in _row_problems(att)
}

_ref(i, att) := {"attestation": i, "source": trust.at(att, ["source"])}

_row_problems(att) := array.concat(_qualification_problems(att), _gate_problems(att))

# METADATA
# scope: document
# description: >-
#   The other producer releases a qualification names (producer_releases): each wrote the very
#   bytes of the fixture, as a fixture-provenance statement about the same digest says.
default releases(_) := []

releases(att) := r if {
	r := _p(att, ["producer_releases"])
	is_array(r)
}

# METADATA
# scope: document
# description: >-
#   The problems of the row of one release a qualification names: the qualification's own, that
#   release's gate, and whether a stored, trusted provenance statement vouches for it.
release_problems(i, att, release) := {_reason(code, msg, object.union(_ref(i, att), ev)) |
	some [code, msg, ev] in array.concat(
		array.concat(_qualification_problems(att), _release_gate_problems(att, release)),
		_unproven(att, release),
	)
}

_release_gate_problems(att, release) := [problem |
	adapter := _p(att, ["adapter", "name"])
	problem := _gate_problem(adapter, gates.gate(adapter, data.ckptgate.config), {
		"name": object.get(release, "name", null),
		"version": object.get(release, "version", null),
	})
]

_unproven(att, release) := [] if [_p(att, ["fixture", "digest"]), release] in vouched

else := [[
	"producer_release_unproven",
	sprintf("no trusted fixture-provenance statement %v says %v %v wrote fixture %v (manifest %v)", [
		object.get(release, "provenance", null), object.get(release, "name", null),
		object.get(release, "version", null), _p(att, ["fixture", "digest"]), object.get(release, "manifest", null),
	]),
	{"release": release, "fixture_digest": _p(att, ["fixture", "digest"])},
]]

# The stored provenance statements, by source: a release names the one that vouches for it.
_provenance_by_source[trust.at(p, ["source"])] := [j, p] if {
	some j, p in _attestations
	trust.at(p, ["statement", "predicateType"]) == data.ckptgate.config.intake.predicates.provenance.type
}

# METADATA
# scope: document
# description: >-
#   [fixture digest, release] for each release a qualification names whose provenance statement is
#   stored and verified, is about that fixture digest (its only subject) through the release's
#   generation record, names exactly that release and is trusted (a statement of an earlier
#   candidate commit counts, as for the gate).
vouched contains [digest, release] if {
	some att in _attestations
	trust.at(att, ["statement", "predicateType"]) == _qualification_type
	some release in releases(att)
	semver.is_valid(release.version)
	digest := _p(att, ["fixture", "digest"])
	[j, p] := _provenance_by_source[release.provenance]
	_p(p, ["fixture", "digest"]) == digest
	_single_subject(p, digest)
	_p(p, ["fixture", "manifest"]) == release.manifest
	_p(p, ["producer", "name"]) == release.name
	_p(p, ["producer", "version"]) == release.version
	every problem in trust.problems(j, p, _context, _config) {
		problem.code in _gate_tolerated
	}
}

# METADATA
# scope: document
# description: >-
#   The problems of a qualification beyond trust, without the gate's: what decides whether it
#   is a passing qualification with retained evidence (the generated gate, support.qualified).
qualification_problems(i, att) := {_reason(code, msg, object.union(_ref(i, att), ev)) |
	some [code, msg, ev] in _qualification_problems(att)
}

_qualification_problems(att) := array.concat(
	array.concat(_incomplete(att), _refusals(att)),
	_head_problems,
)

# METADATA
# scope: document
# description: Claim-rule-3 fields that are missing or not exact, by field name.
claim_fields(att) := {
	"adapter.name": _non_empty(_p(att, ["adapter", "name"])),
	"adapter.version": semver.is_valid(_p(att, ["adapter", "version"])),
	"producer.name": _non_empty(_p(att, ["producer", "name"])),
	"producer.version": semver.is_valid(_p(att, ["producer", "version"])),
	"fixture.digest": regex.match(`^sha256:[0-9a-f]{64}$`, _text(_p(att, ["fixture", "digest"]))),
	"candidate_commit": regex.match(`^[0-9a-f]{40}$`, _text(_p(att, ["candidate_commit"]))),
	"environment": _non_empty_object(_p(att, ["environment"])),
	"topology": _non_empty_object(_p(att, ["topology"])),
	"result.status": _non_empty(_p(att, ["result", "status"])),
	"result.evidence.digest": regex.match(`^sha256:[0-9a-f]{64}$`, _text(_p(att, ["result", "evidence", "digest"]))),
	"result.evidence.location": _retained_location(_p(att, ["result", "evidence", "location"])),
}

_incomplete(att) := [[
	"claim_incomplete", sprintf("claim rule 3 needs an exact %s; this attestation has %v", [
		field,
		_claim_value(att, field),
	]),
	{"field": field, "value": _claim_value(att, field)},
] |
	some field, ok in claim_fields(att)
	ok == false
]

_claim_value(att, field) := _p(att, split(field, "."))

_refusals(att) := [problem |
	some problem in [
		_result_failed(att),
		_result_not_retained(att),
		_fixture_not_subject(att),
		_names_evidence_commit(att),
	]
	problem != null
]

default _result_failed(_) := null

_result_failed(att) := ["result_failed", sprintf("the qualification result is %v, not passed", [status]), {
	"result": status,
	"evidence": _p(att, ["result", "evidence"]),
}] if {
	status := _p(att, ["result", "status"])
	is_string(status)
	status != "passed"
}

default _result_not_retained(_) := null

# A well-formed location whose file, read by Python (input retained_result), is missing or holds
# other bytes than the statement's evidence digest: the result the row would rest on is not the
# one that was signed. (A malformed location is claim_incomplete already.)
_result_not_retained(att) := [
	"result_not_retained",
	sprintf("the retained result %v has sha256 %v; the attestation names %v", [location, held, attested]),
	{"location": location, "retained_sha256": held, "attested_digest": attested},
] if {
	location := _p(att, ["result", "evidence", "location"])
	_retained_location(location)
	attested := _p(att, ["result", "evidence", "digest"])
	held := object.get(att, ["retained_result", "sha256"], null)
	not _retained_as_attested(att, location, attested)
}

# The fact must be about the attested location, and hold the attested bytes.
_retained_as_attested(att, location, attested) if {
	att.retained_result.location == location
	att.retained_result.sha256 == attested
}

default _fixture_not_subject(_) := null

_fixture_not_subject(att) := [
	"attestation_digest_mismatch",
	sprintf("predicate fixture digest %v is not the statement's only subject", [_p(att, ["fixture", "digest"])]),
	{"fixture_digest": _p(att, ["fixture", "digest"]), "subject": trust.at(att, ["statement", "subject"])},
] if {
	is_string(_p(att, ["fixture", "digest"]))
	not _single_subject(att, _p(att, ["fixture", "digest"]))
}

_single_subject(att, digest) if {
	[subject] := trust.at(att, ["statement", "subject"])
	concat(":", ["sha256", subject.digest.sha256]) == digest
}

default _names_evidence_commit(_) := null

_names_evidence_commit(att) := [
	"candidate_commit_is_evidence_commit",
	sprintf("it names %v, an evidence commit, as its candidate; an evidence commit cannot name itself", [named]),
	{"named": named, "candidate_commit": _candidate},
] if {
	named := _p(att, ["candidate_commit"])
	named in evidence_commits
}

# METADATA
# scope: document
# description: >-
#   Commits after the candidate that change only attestations/ and matrix/, plus HEAD when
#   HEAD is not the candidate.
evidence_commits contains commit if {
	some commit in object.get(input, ["head", "evidence_commits"], [])
	commit != _candidate
}

evidence_commits contains head if {
	head := object.get(input, ["head", "commit"], null)
	is_string(head)
	head != _candidate
}

# METADATA
# scope: document
# description: >-
#   Names of the candidate-commit conditions input.head fails; empty when the candidate
#   commit is established by the definition above.
head_failures contains name if {
	some name, ok in _head_checks
	ok == false
}

head_failures contains "head" if not _head_checks

_head_checks := {
	"candidate_commit": regex.match(`^[0-9a-f]{40}$`, _text(_candidate)),
	"commit": regex.match(`^[0-9a-f]{40}$`, _text(object.get(input, ["head", "commit"], null))),
	"source_tree": _non_empty(object.get(input, ["head", "source_tree"], null)),
	"trees_equal": _trees_equal(object.get(input, "head", null)),
	"candidate_not_evidence": not_listed(_candidate, object.get(input, ["head", "evidence_commits"], [])),
	"evidence_commits": is_array(object.get(input, ["head", "evidence_commits"], [])),
}

_head_problems := [["candidate_commit_unverified", msg, ev] |
	count(head_failures) > 0
	failed := sort(head_failures)
	msg := sprintf("the candidate commit is not established from input.head (%s)", [concat(", ", failed)])
	ev := {"failed": failed, "head": object.get(input, "head", null)}
]

default _trees_equal(_) := false

_trees_equal(head) if head.source_tree == head.candidate_source_tree

_gate_problems(att) := [problem |
	adapter := _p(att, ["adapter", "name"])
	problem := _gate_problem(adapter, gates.gate(adapter, data.ckptgate.config), _p(att, ["producer"]))
]

_gate_problem(adapter, null, _) := [
	"adapter_unknown",
	sprintf("adapter %v has no producer-release gate", [adapter]),
	{"adapter": adapter},
]

# The qualified releases are generated from these very rows (support.qualified), so a row's
# release is outside its adapter's gate only when it names another producer than the gate's, or
# when a policy-data overlay's restriction leaves it out.
_gate_problem(adapter, g, producer) := [
	"producer_release_unqualified",
	sprintf("producer %v %v is outside the gate for adapter %v (%v)", [
		trust.at(producer, ["name"]), trust.at(producer, ["version"]),
		adapter, _gate_words(g),
	]),
	{"adapter": adapter, "producer": producer, "gate": object.remove(g, ["rows"])},
] if {
	g != null
	not _admitted(producer, g)
}

_admitted(producer, g) if {
	gates.producer_matches(producer.name, g.producer)
	gates.within(producer.version, g)
}

_gate_words(g) := sprintf("%v, restricted by policy data to %v", [g.producer, g.versions]) if gates.restricted(g)

else := sprintf("%v", [g.producer])

# METADATA
# scope: document
# description: True when x is not in list (total, also for non-lists).
default not_listed(_, _) := true

not_listed(x, list) := false if x in list

default _non_empty(_) := false

_non_empty(x) if {
	is_string(x)
	x != ""
}

default _non_empty_object(_) := false

_non_empty_object(x) if {
	is_object(x)
	count(x) > 0
}

default _text(_) := ""

_text(x) := x if is_string(x)

default _retained_location(_) := false

_retained_location(x) if {
	_non_empty(x)
	not startswith(x, "/")
	not contains(x, "\\")
	not ".." in split(x, "/")
}
