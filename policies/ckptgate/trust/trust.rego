# METADATA
# title: ckptgate.trust
# description: >-
#   Decides which verified attestations are trusted, and says why the others are not. Python has
#   already checked the cryptography; a failure there never arrives here as a fact. Trust is
#   data-driven (data.ckptgate.config.trust): a signer is trusted only for its listed predicate
#   types and producer scopes, matched by SPKI digest or Sigstore identity and issuer, never by
#   keyid. An attestation is trusted only when it is well formed, signed by such a signer, bound
#   to the fixture digest, fresh at request.now and, when the request names a candidate commit,
#   bound to that commit. A signature establishes integrity only under this separate trust
#   decision [R27].
# related_resources:
#   - ref: https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md
#     description: in-toto Statement v1
package ckptgate.trust

# METADATA
# description: >-
#   Indices of input.attestations that pass every trust check for this request
#   (fixture digest, request.now, request.candidate_commit).
# entrypoint: true
trusted_attestations contains i if {
	some i, att in input.attestations
	count(problems(i, att, request_context, _config)) == 0
}

# METADATA
# description: Reasons, one per failed check, for every attestation that is not trusted.
# entrypoint: true
reasons contains reason if {
	some i, att in input.attestations
	some reason in problems(i, att, request_context, _config)
}

# METADATA
# description: >-
#   The request facts that trust checks bind to. now_ns is null when request.now is not an
#   RFC 3339 time; candidate_commit is null when the request binds no commit. The fixture is
#   always bound: a missing fixture digest binds nothing, so no attestation is trusted.
request_context := {
	"bind_fixture": true,
	"fixture_digest": object.get(input, ["fixture", "digest"], null),
	"now_ns": time_ns(object.get(input, ["request", "now"], null)),
	"candidate_commit": object.get(input, ["request", "candidate_commit"], null),
}

_config := {
	"signers": object.get(data.ckptgate.config, ["trust", "signers"], []),
	"intake": data.ckptgate.config.intake,
	"offered_keys": object.get(input, "offered_keys", []),
}

# METADATA
# scope: document
# description: Nanoseconds since the epoch for an RFC 3339 string; null for anything else.
default time_ns(_) := null

time_ns(value) := time.parse_rfc3339_ns(value) if is_string(value)

# METADATA
# scope: document
# description: >-
#   Every trust problem of one attestation, as reason objects. Empty means trusted. ctx holds
#   bind_fixture, fixture_digest, now_ns and candidate_commit (null: no commit binding).
#   cfg holds signers (trust data) and intake (intake data). When the checks cannot be
#   evaluated at all, the one problem is attestation_unchecked (fail closed).
default problems(_, _, _, _) := {{
	"code": "attestation_unchecked",
	"message": "the trust checks could not be evaluated (policy data or request context incomplete)",
	"evidence": {},
}}

problems(i, att, ctx, cfg) := {_reason(code, i, att, ctx, cfg) |
	some code, failed in c
	failed
} if {
	c := checks(att, ctx, cfg)
}

# METADATA
# description: Each trust check by reason code; true means the check failed.
checks(att, ctx, cfg) := {
	"attestation_malformed": count(malformed_fields(att, cfg.intake)) > 0,
	"attestation_untrusted_signer": signer_trusted(att, cfg) == false,
	"attestation_digest_mismatch": _fixture_unbound(att, ctx),
	"attestation_predicate_mismatch": predicate_unbound(att, cfg),
	"attestation_extra_subjects": extra_subjects_over(att, cfg),
	"attestation_freshness_unchecked": _freshness_unknown(ctx.now_ns, cfg.intake.freshness),
	"attestation_expired": expired(att, ctx.now_ns, cfg.intake.freshness),
	"attestation_not_yet_valid": not_yet_valid(att, ctx.now_ns, cfg.intake.freshness),
	"attestation_wrong_commit": commit_bound(att, ctx.candidate_commit) == false,
}

default _fixture_unbound(_, _) := true

_fixture_unbound(_, ctx) := false if ctx.bind_fixture == false

_fixture_unbound(att, ctx) := false if binds_fixture(att, ctx.fixture_digest)

# METADATA
# scope: document
# description: Value at path in x, or null when x is not an object or the path is absent.
default at(_, _) := null

at(x, path) := object.get(x, path, null) if is_object(x)

# METADATA
# description: >-
#   Names of the required attestation fields that are missing or of the wrong type. intake is
#   data.ckptgate.config.intake: its statement_types, and the shape of att's predicate kind.
malformed_fields(att, intake) := {name |
	some name, ok in _field_checks(att, intake)
	ok == false
}

_field_checks(att, intake) := object.union(
	{
		"statement._type": _member(at(att, ["statement", "_type"]), intake.statement_types),
		"statement.predicateType": _non_empty_string(at(att, ["statement", "predicateType"])),
		"statement.subject": _non_empty_array(at(att, ["statement", "subject"])),
		"statement.predicate": is_object(at(att, ["statement", "predicate"])),
		"signers": _non_empty_array(at(att, ["signers"])),
	},
	_shape_checks(att, shape(att, intake.predicates), intake.predicates),
)

# An OpenSSF Model Signing statement (bound by Python to the measured per-file manifest) carries
# resources and a serialization block; it has no producer and no validity window.
_shape_checks(att, "model_signing", _) := {
	"predicate.resources": _non_empty_array(at(att, ["statement", "predicate", "resources"])),
	"predicate.serialization": is_object(at(att, ["statement", "predicate", "serialization"])),
	"verification.binding": _manifest_bound(att),
}

# Another in-toto predicate (SLSA provenance, say) names its producer (for SLSA, the builder id) at
# the kind's producer_path; it has no validity window.
_shape_checks(att, "in_toto", predicates) := {name: ok} if {
	name := concat(".", array.concat(["predicate"], _producer_path(att, predicates)))
	ok := _non_empty_string(producer(att, predicates))
}

_shape_checks(att, "ckptgate", _) := {
	"predicate.producer.name": _non_empty_string(at(att, ["statement", "predicate", "producer", "name"])),
	"predicate.producer.version": _non_empty_string(at(att, ["statement", "predicate", "producer", "version"])),
	"predicate.validity.issued_at": is_number(time_ns(at(att, ["statement", "predicate", "validity", "issued_at"]))),
	"predicate.validity.expires_at": is_number(time_ns(at(att, ["statement", "predicate", "validity", "expires_at"]))),
}

default _member(_, _) := false

_member(x, xs) if {
	is_array(xs)
	x in xs
}

default _freshness_unknown(_, _) := true

_freshness_unknown(now_ns, freshness) := false if {
	is_number(now_ns)
	is_number(freshness.max_age_seconds)
	is_number(freshness.max_clock_skew_seconds)
}

default _non_empty_string(_) := false

_non_empty_string(x) if {
	is_string(x)
	x != ""
}

default _non_empty_array(_) := false

_non_empty_array(x) if {
	is_array(x)
	count(x) > 0
}

# METADATA
# scope: document
# description: >-
#   True when some signer of att matches a trusted signer entry that lists att's predicate
#   type, its producer (or "*") and the predicate's kind (or "*") among its scopes. Keys match
#   by SPKI digest and algorithm, Sigstore signers by identity and issuer; the keyid hint is
#   never used. cfg holds signers and intake.
default signer_trusted(_, _) := false

signer_trusted(att, cfg) if {
	predicate_type := at(att, ["statement", "predicateType"])
	some kind in kinds(att, cfg.intake.predicates)
	some signer in at(att, ["signers"])
	some entry in cfg.signers
	signer_matches(signer, entry)
	predicate_type in entry.predicate_types
	_in_scope(producer(att, cfg.intake.predicates), entry.producers)
	_in_scope(kind, entry.scopes)
	_builder_in_scope(att, kind, entry, cfg.intake.predicates)
}

# A key named on the command line (input.offered_keys, verified by Python) is trusted only for
# the predicate types whose intake data sets offered_keys: never for ckptgate's own predicates.
signer_trusted(att, cfg) if {
	some kind in kinds(att, cfg.intake.predicates)
	cfg.intake.predicates[kind].offered_keys == true
	some signer in at(att, ["signers"])
	is_string(signer.offered)
	some entry in object.get(cfg, "offered_keys", [])
	signer_matches(signer, entry)
}

# A Model Signing statement names no producer: a signer verified by Python (an X.509 certificate
# against the --certificate-chain anchors, or a Sigstore identity) is trusted when a trust-data
# entry matches it (a certificate entry by one of its SANs and the root its chain led to, a
# sigstore entry by identity and issuer), lists the predicate type, and scopes its kind.
signer_trusted(att, cfg) if {
	shape(att, cfg.intake.predicates) == "model_signing"
	predicate_type := at(att, ["statement", "predicateType"])
	some kind in kinds(att, cfg.intake.predicates)
	some signer in at(att, ["signers"])
	signer.kind in {"certificate", "sigstore"}
	some entry in cfg.signers
	signer_matches(signer, entry)
	predicate_type in entry.predicate_types
	_in_scope(kind, entry.scopes)
}

# A kind with builder_scope (training provenance) is vouched for only by a signer whose trust
# entry lists the statement's builder id (runDetails.builder.id) in builder_ids, or "*"; an
# entry without builder_ids vouches for no builder.
_builder_in_scope(_, kind, _, predicates) if object.get(predicates[kind], "builder_scope", false) == false

_builder_in_scope(att, kind, entry, predicates) if {
	predicates[kind].builder_scope == true
	builder := at(at(att, ["statement", "predicate"]), ["runDetails", "builder", "id"])
	_in_scope(builder, object.get(entry, "builder_ids", []))
}

_in_scope(name, scopes) if {
	is_string(name)
	"*" in scopes
}

_in_scope(name, scopes) if name in scopes

# METADATA
# scope: document
# description: True when a verified signer is the trusted signer entry.
signer_matches(signer, entry) if {
	signer.kind == "key"
	entry.kind == "key"
	_non_empty_string(entry.spki_sha256)
	lower(signer.spki_sha256) == lower(entry.spki_sha256)
	signer.algorithm == entry.algorithm
}

signer_matches(signer, entry) if {
	signer.kind == "certificate"
	entry.kind == "certificate"
	_non_empty_string(entry.identity)
	_non_empty_string(entry.root_sha256)
	entry.identity in signer.identities
	lower(signer.root_sha256) == lower(entry.root_sha256)
}

signer_matches(signer, entry) if {
	signer.kind == "sigstore"
	entry.kind == "sigstore"
	_non_empty_string(entry.identity)
	signer.identity == entry.identity
	signer.issuer == entry.issuer
}

# METADATA
# scope: document
# description: >-
#   True when Python bound a subject of att to the measured fixture and that bound subject
#   (verification.subject_digest) is the fixture digest ("<alg>:<hex>"), which a subject of
#   the statement carries.
default binds_fixture(_, _) := false

binds_fixture(att, fixture_digest) if {
	at(att, ["verification", "subject_matches_fixture"]) == true
	at(att, ["verification", "subject_digest"]) == fixture_digest
	[alg, digest_hex] := split(fixture_digest, ":")
	some subject in at(att, ["statement", "subject"])
	subject.digest[alg] == digest_hex
}

binds_fixture(att, fixture_digest) if {
	_manifest_bound(att)
	at(att, ["verification", "manifest_matches_fixture"]) == true
	at(att, ["verification", "subject_digest"]) == fixture_digest
}

# METADATA
# scope: document
# description: >-
#   True when att is of one of ckptgate's predicate types (cfg.intake.predicates) and its
#   predicate is not about the subject the binding used: predicate.fixture.digest is not
#   verification.subject_digest, or Python found a predicate field naming the attested
#   checkpoint (verification.predicate_subject) that names another, or checked none. A second
#   subject never inherits a predicate that is about the first. Applies to every request,
#   whether or not it binds a fixture (the support matrix does not).
default predicate_unbound(_, _) := true

predicate_unbound(att, cfg) := false if {
	count(kinds(att, cfg.intake.predicates)) == 0
}

predicate_unbound(att, cfg) := false if {
	_manifest_bound(att)
	shape(att, cfg.intake.predicates) == "model_signing"
}

# An in-toto predicate of another shape names no fixture digest: Python bound its subjects, to the
# fixture digest or file by file to the measured manifest, and binds_fixture checks that.
predicate_unbound(att, cfg) := false if shape(att, cfg.intake.predicates) == "in_toto"

predicate_unbound(att, _) := false if {
	bound := at(att, ["verification", "subject_digest"])
	is_string(bound)
	at(att, ["statement", "predicate", "fixture", "digest"]) == bound
	fields := at(att, ["verification", "predicate_subject"])
	is_object(fields)
	count(fields) > 0
	every named in fields {
		named == true
	}
}

# METADATA
# scope: document
# description: >-
#   True when att expired at now_ns: past validity.expires_at, or issued longer ago than
#   freshness.max_age_seconds. False when the times are unknown (other checks report that).
default expired(_, _, _) := false

expired(att, now_ns, _) if {
	is_number(now_ns)
	expires := time_ns(at(att, ["statement", "predicate", "validity", "expires_at"]))
	is_number(expires)
	expires <= now_ns
}

expired(att, now_ns, freshness) if {
	is_number(now_ns)
	issued := time_ns(at(att, ["statement", "predicate", "validity", "issued_at"]))
	now_ns - issued > freshness.max_age_seconds * 1000000000
}

# METADATA
# scope: document
# description: True when att was issued after now_ns plus the allowed clock skew.
default not_yet_valid(_, _, _) := false

not_yet_valid(att, now_ns, freshness) if {
	is_number(now_ns)
	issued := time_ns(at(att, ["statement", "predicate", "validity", "issued_at"]))
	issued > now_ns + (freshness.max_clock_skew_seconds * 1000000000)
}

# METADATA
# scope: document
# description: True when commit is null (no binding asked) or att's predicate names exactly commit.
default commit_bound(_, _) := false

commit_bound(_, null)

commit_bound(att, commit) if {
	_non_empty_string(commit)
	at(att, ["statement", "predicate", "candidate_commit"]) == commit
}

_ref(i, att) := {"attestation": i, "source": at(att, ["source"])}

_reason(code, i, att, ctx, cfg) := {
	"code": code,
	"message": sprintf("attestation %s: %s", [_name(i, att), _message(code, att, ctx, cfg)]),
	"evidence": object.union(_ref(i, att), _evidence(code, att, ctx, cfg)),
}

_name(i, att) := sprintf("%v (index %d)", [at(att, ["source"]), i])

_message("attestation_malformed", att, _, cfg) := sprintf(
	"required fields are missing or invalid: %s",
	[concat(", ", sort(malformed_fields(att, cfg.intake)))],
)

_message("attestation_untrusted_signer", att, _, cfg) := sprintf(
	"no signer is trusted for predicate type %v and producer %v; its signers: %v",
	[
		at(att, ["statement", "predicateType"]),
		producer(att, cfg.intake.predicates),
		_signer_names(att),
	],
)

_message("attestation_extra_subjects", att, _, cfg) := sprintf(
	"%v of its subjects name no file of the checkpoint (a signed file may have been removed); predicate type %v allows %v",
	[
		at(att, ["verification", "manifest", "extra_subjects"]),
		at(att, ["statement", "predicateType"]),
		_extra_limit(att, cfg),
	],
)

_message("attestation_digest_mismatch", _, ctx, _) := sprintf(
	"its subject is not the measured fixture digest %v",
	[ctx.fixture_digest],
)

_message("attestation_predicate_mismatch", att, _, _) := sprintf(
	"its predicate is about fixture %v, not the subject %v that was bound to the measured bytes",
	[at(att, ["statement", "predicate", "fixture", "digest"]), at(att, ["verification", "subject_digest"])],
)

_message("attestation_freshness_unchecked", _, _, _) := concat("", [
	"freshness cannot be checked: request.now is not an RFC 3339 time ",
	"or the freshness policy data is incomplete",
])

_message("attestation_expired", att, _, cfg) := sprintf(
	"expired: expires_at %v, issued_at %v, maximum age %d seconds",
	[
		at(att, ["statement", "predicate", "validity", "expires_at"]),
		at(att, ["statement", "predicate", "validity", "issued_at"]),
		cfg.intake.freshness.max_age_seconds,
	],
)

_message("attestation_not_yet_valid", att, _, _) := sprintf(
	"issued in the future: issued_at %v is after the request time",
	[at(att, ["statement", "predicate", "validity", "issued_at"])],
)

_message("attestation_wrong_commit", att, ctx, _) := sprintf(
	"it qualifies candidate commit %v, not the requested candidate commit %v",
	[at(att, ["statement", "predicate", "candidate_commit"]), ctx.candidate_commit],
)

_signer_names(att) := [name |
	some signer in at(att, ["signers"])
	name := object.get(signer, "signer_id", object.get(signer, "identity", "unnamed signer"))
]

_evidence("attestation_malformed", att, _, cfg) := {"fields": sort(malformed_fields(att, cfg.intake))}

_evidence("attestation_extra_subjects", att, _, cfg) := {
	"manifest": at(att, ["verification", "manifest"]),
	"max_extra_subjects": _extra_limit(att, cfg),
}

_evidence("attestation_untrusted_signer", att, _, cfg) := {
	"predicate_type": at(att, ["statement", "predicateType"]),
	"producer": producer(att, cfg.intake.predicates),
	"signers": at(att, ["signers"]),
}

_evidence("attestation_digest_mismatch", att, ctx, _) := {
	"fixture_digest": ctx.fixture_digest,
	"subject": at(att, ["statement", "subject"]),
	"subject_matches_fixture": at(att, ["verification", "subject_matches_fixture"]),
}

_evidence("attestation_predicate_mismatch", att, _, _) := {
	"predicate_fixture_digest": at(att, ["statement", "predicate", "fixture", "digest"]),
	"subject_digest": at(att, ["verification", "subject_digest"]),
	"predicate_subject": at(att, ["verification", "predicate_subject"]),
	"subject": at(att, ["statement", "subject"]),
}

_evidence("attestation_freshness_unchecked", _, _, _) := {"field": "request.now"}

_evidence("attestation_expired", att, _, cfg) := {
	"validity": at(att, ["statement", "predicate", "validity"]),
	"max_age_seconds": cfg.intake.freshness.max_age_seconds,
}

_evidence("attestation_not_yet_valid", att, _, cfg) := {
	"validity": at(att, ["statement", "predicate", "validity"]),
	"max_clock_skew_seconds": cfg.intake.freshness.max_clock_skew_seconds,
}

_evidence("attestation_wrong_commit", att, ctx, _) := {
	"attested_commit": at(att, ["statement", "predicate", "candidate_commit"]),
	"requested_commit": ctx.candidate_commit,
}
