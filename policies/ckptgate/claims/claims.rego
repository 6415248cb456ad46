# METADATA
# title: ckptgate.claims
# description: >-
#   The claims lint over documentation sentences (input.sentences: file, line, text, citations,
#   origin, and facts: the claim model's clauses, each with the systems mentioned, capability and
#   safety predicates with their polarity and agent, topics and bounding cues, as extracted by
#   ckptgate.evidence.claimfacts), the register ids defined in docs/references.md
#   (input.references), the support matrix rows of the repository being checked (input.matrix)
#   and the rows of generated matrix tables (input.generated). Each rule applies one of the
#   register's claim rules 1-7; the vocabulary is policy data (data.ckptgate.config.claims).
#   Violations are objects {code, severity, message, evidence, location}; severity "warning"
#   (an unknown system) does not fail the check.
package ckptgate.claims

_cfg := data.ckptgate.config.claims

_pattern(name) := _cfg.patterns[name]

_has(name, text) if regex.match(_pattern(name), text)

_violation(code, message, s) := {
	"code": code,
	"severity": object.get(_severity, code, "error"),
	"message": message,
	"evidence": {"text": s.text, "citations": object.get(s, "citations", [])},
	"location": {"file": s.file, "line": s.line},
}

_severity := {}

# Whose matrix was read: the repository's own (input.matrix_source), or none.
_supported_count := count([r | some r in input.matrix; r.status == "supported"])

_no_matrix := "has no support matrix, so no capability claim about a system, platform or scale is backed"

_matrix_note := sprintf("the support matrix read is %s's %s, with %d supported row(s)", [
	input.matrix_source.name,
	input.matrix_source.path,
	_supported_count,
]) if {
	is_string(input.matrix_source.path)
} else := sprintf("%s %s", [input.matrix_source.name, _no_matrix]) if {
	is_string(input.matrix_source.name)
} else := sprintf("the support matrix read has %d supported row(s)", [_supported_count])

# The register's claim rules, in words (no need to open docs/references.md).
_rule_text(name) := _cfg.rule_texts[name]

# METADATA
# description: Every violation of claim rules 1-7, of citation existence and of generated tables, as objects.
# entrypoint: true
violations contains v if {
	some s in input.sentences
	some v in _sentence_violations(s)
}

violations contains v if {
	some g in object.get(input, "generated", [])
	some v in _generated_violations(g)
}

_sentence_violations(s) := {v |
	some code, message in _checks(s)
	v := _violation(code, message, s)
}

_checks(s) := object.union_n([
	_rule1_vendor_verb(s),
	_rule1_vendor_support(s),
	_rule2_interpretation(s),
	_rule3_support(s),
	_rule4_historical(s),
	_rule5_safety(s),
	_rule6_trust(s),
	_rule7_os_controls(s),
	_unlisted_capability(s),
	_unknown_citations(s),
])

# A sentence whose citations are all vendor sources describes vendor behaviour; a sentence
# about the register itself (docs/references.md, source ids) describes nothing upstream.
_vendor_cited(s) if {
	count(s.citations) > 0
	not _has("register_pointer", s.text)
	every id in s.citations {
		id in _cfg.vendor_ids
	}
}

# Rule 1: vendor behaviour is what a vendor documents, defines or currently implements. A
# docstring's citation may mark the source a module follows; there the rule applies to claims.
_rule1_vendor_verb(s) := {"claims_vendor_phrasing": msg} if {
	_vendor_cited(s)
	_phrasing_applies(s)
	not _has("vendor_verb", s.text)
	not _has("interpretation", s.text) # a marked project interpretation (rule 2) is not vendor behaviour
	msg := _rule_text("r1_phrasing")
} else := {}

_phrasing_applies(s) if object.get(s, "origin", "doc") != "docstring"

_phrasing_applies(s) if {
	some c in _clauses(s)
	_capability_claim(s, c)
	some m in c.systems
	_checked_mention(m, _system(m.id))
}

_phrasing_applies(s) if count(_safety_claims(s)) > 0

# Rule 1: vendor documentation is never turned into a ckptgate support claim about a system.
_rule1_vendor_support(s) := {"claims_vendor_as_support": msg} if {
	_vendor_cited(s)
	some c in _clauses(s)
	_capability_claim(s, c)
	_cites_or_unbacked(s, c)
	some m in c.systems
	_checked_mention(m, _system(m.id))
	msg := _rule_text("r1_support")
} else := {}

# The claim has no supported row, or it is drawn from the vendor's documentation ("X documents
# Y, so ckptgate supports Z"; "ckptgate supports Z because X documents Y").
_cites_or_unbacked(s, c) if count(_unbacked(s, c)) > 0

_cites_or_unbacked(s, c) if {
	c.connective in {"so", "therefore", "hence", "thus", "consequently", "which means"}
	some other in _clauses(s)
	other.vendor_phrasing
	not other.negation
}

_cites_or_unbacked(s, _) if {
	some other in _clauses(s)
	other.connective in {"because", "since"}
	other.vendor_phrasing
	not other.negation
}

# Rule 2: device_map is not checkpoint-rank topology; such statements are marked as our interpretation.
_rule2_interpretation(s) := {"claims_unmarked_interpretation": msg} if {
	_has("device_map", s.text)
	not _has("interpretation", s.text)
	msg := _rule_text("r2")
} else := {}

# Rule 4: archived or versioned documentation is historical evidence only.
_rule4_historical(s) := {"claims_archived_not_historical": msg} if {
	_has("archived_doc", s.text)
	not _has("historical", s.text)
	msg := _rule_text("r4")
} else := {}

# ------------------------------------------------------------------------- the claim model
_clauses(s) := object.get(object.get(s, "facts", {}), "clauses", [])

_asserted(s, c) if {
	not s.facts.interrogative
	not c.hypothetical
	not c.question # a question its answer neither affirms nor denies (claimfacts)
}

# A capability claim made by or about ckptgate: positive, not vendor behaviour, not a question.
_capability_claim(s, c) if {
	not s.facts.register_entry
	_asserted(s, c)
	some p in c.capability
	not p.negated
	not p.agent in {"vendor", "consumer"}
}

_scoped(_, c) if count(c.scope) > 0

_scoped(s, _) if count(s.facts.scope) > 0

_system(id) := object.get(_cfg.systems, id, {})

_row_formats(row) := row.format if is_array(row.format)

_row_formats(row) := [row.format] if is_string(row.format)

_row_matches(sys, row) if {
	some f in object.get(object.get(sys, "rows", {}), "formats", [])
	f in _row_formats(row)
}

_row_matches(sys, row) if {
	some a in object.get(object.get(sys, "rows", {}), "adapters", [])
	row.adapter == a
}

_supported_row(sys) if {
	some row in input.matrix
	row.status == "supported"
	_row_matches(sys, row)
}

_version_supported(v) if {
	some row in input.matrix
	row.status == "supported"
	row.producer == v.producer
	_version_prefix(v.version, row.producer_version)
}

# "2.13" is "2.13.0"; "0.19" (a series) is not "0.19.8", and "2" is not "2.13.0".
_version_prefix(v, full) if v == full

_version_prefix(v, full) if full == concat("", [v, ".0"])

_version_prefix(v, full) if full == concat("", [v, ".0.0"])

# Tools are named as references; a framework counts when it is what the claim is about
# ("works with PyTorch", "Lightning checkpoints"), not an instrument ("written with torch").
_checked_mention(_, sys) if not sys.kind in {"tool", "framework"}

_checked_mention(m, sys) if {
	sys.kind == "framework"
	m.object
}

# Why one clause's capability claim is not backed by a supported row (empty when it is).
_unbacked(s, c) := (({r |
	some m in c.systems
	sys := _system(m.id)
	_checked_mention(m, sys)
	r := _system_reason(s, c, m, sys)
} | {r |
	some v in c.versions
	r := _version_reason(v)
}) | {r |
	count(c.universal) > 0
	not _scoped(s, c)
	r := sprintf("%q claims every variant, but support is per matrix row", [c.universal[0]])
}) | {r |
	some e in object.get(c, "entities", [])
	not _declared_fact(e.term)
	not _scale_in_matrix(e)
	not _scoped(s, c)
	r := sprintf("%s (%s) is neither a system with a supported matrix row nor a fact this repository declares", [
		e.term,
		_entity_kinds[e.kind],
	])
}

_entity_kinds := {
	"name": "a name the claims vocabulary does not know",
	"platform": "a platform, hardware or infrastructure",
	"count": "a scale or topology",
}

# "at 2 ranks": a scale that a supported row's topology records (world_size).
_scale_in_matrix(e) if {
	e.kind == "count"
	regex.match(`(?i)\b(?:ranks?|processes|gpus?|workers)$`, e.term)
	some row in input.matrix
	row.status == "supported"
	object.get(object.get(row, "topology", {}), "world_size", null) == e.number
}

# A fact the repository declares in a reviewed list (data.ckptgate.config.claims.facts), such as
# "runs on Linux".
_declared_fact(term) if {
	some f in object.get(_cfg, "facts", [])
	regex.match(f.match, term)
}

_system_reason(_, _, m, sys) := sprintf("%s (%s) has no row the matrix marks supported", [m.term, m.id]) if {
	object.get(sys, "rows", null) != null
	not _supported_row(sys)
}

_system_reason(s, c, m, sys) := reason if {
	object.get(sys, "rows", null) == null
	not _family_scoped(s, c, sys)
	note := object.get(sys, "note", "")
	reason := trim_space(sprintf("%s (%s, a %s) has no matrix row; %s", [m.term, m.id, sys.kind, note]))
}

# A family or framework named together with a scope limited to matrix rows delegates to the matrix.
_family_scoped(s, c, sys) if {
	sys.kind in {"family", "framework"}
	_scoped(s, c)
}

_version_reason(v) := sprintf("%s is open-ended; support is per exact producer version", [v.term]) if v.open

_version_reason(v) := sprintf("%s matches no supported row's producer version", [v.term]) if {
	not v.open
	not _version_supported(v)
}

# Rule 3: a capability claim (supports, handles, reads, works with, compatible ...) about a system
# or variant must match a row the matrix marks supported; a universal claim needs matrix scope.
_rule3_support(s) := {"claims_support_not_in_matrix": msg} if {
	reasons := {r |
		some c in _clauses(s)
		_capability_claim(s, c)
		some r in _unbacked(s, c)
	}
	count(reasons) > 0
	msg := sprintf("%s: %s (%s)", [_rule_text("r3"), concat("; ", sort(reasons)), _matrix_note])
} else := {}

_topics(_, c) := c.topics if count(c.topics) > 0

_topics(s, c) := s.facts.topics if count(c.topics) == 0

_security_topics := {"containment", "os_control", "signature", "surrogate", "loader"}

_counts(_, _, p) if p.class in {"inherent", "harm", "proof", "impossible"}

_counts(s, c, p) if {
	p.class in {"shield", "prevent"}
	count(_security_topics & {t | some t in _topics(s, c)}) > 0
}

_counts(s, c, p) if {
	p.class == "guarantee"
	count({"containment", "os_control", "signature", "surrogate"} & {t | some t in _topics(s, c)}) > 0
}

_counts(s, c, p) if {
	p.class == "trust"
	count({"containment", "surrogate"} & {t | some t in _topics(s, c)}) > 0
}

_safety_claims(s) := [[c, p] |
	some c in _clauses(s)
	_asserted(s, c)
	some p in c.safety
	not p.negated
	_counts(s, c, p)
]

_surrogate(s, c) if "surrogate" in _topics(s, c)

# Rule 5: security claims stay bounded; containment, a loader, a signature or a checkpoint is never
# called safe, harmless or proof of safety.
_rule5_safety(s) := {"claims_containment_as_proof": msg} if {
	terms := {p.term | some [c, p] in _safety_claims(s); not _surrogate(s, c)}
	count(terms) > 0
	msg := sprintf("%s: %s", [
		_rule_text("r5"),
		concat(", ", sort(terms)),
	])
} else := {}

# Rule 6: weights_only, a checksum or a filename is never sufficient trust, authenticity or safety.
_rule6_trust(s) := {"claims_surrogate_trust": msg} if {
	terms := {p.term | some [c, p] in _safety_claims(s); _surrogate(s, c)}
	count(terms) > 0
	msg := sprintf("%s: %s", [
		_rule_text("r6"),
		concat(", ", sort(terms)),
	])
} else := {}

# Rule 7: OS controls are exact-profile mechanisms, not a portable or universal sandbox.
_rule7_os_controls(s) := {"claims_portable_sandbox": msg} if {
	"os_control" in s.facts.topics
	cues := {x |
		some c in _clauses(s)
		_asserted(s, c)
		not c.cross_platform_negated
		count(c.platform_bounds) == 0
		some x in c.cross_platform
	}
	count(cues) > 0
	msg := sprintf("%s: %s", [
		_rule_text("r7"),
		concat(", ", sort(cues)),
	])
} else := {}

# A clause that says ckptgate checks, verifies, enforces or detects something names a feature: the
# claims data lists the capabilities the code has (data.ckptgate.config.claims.capabilities), each
# with the test that shows it; a feature it does not list is not implemented.
_unlisted_capability(s) := {"claims_unlisted_capability": msg} if {
	object.get(s, "origin", "doc") in {"doc", "generated-notes"}
	objects := {f.object |
		some c in _clauses(s)
		_asserted(s, c)
		some f in object.get(c, "features", [])
		not f.negated
		not f.agent in {"vendor", "consumer"}
		not _listed_capability(f)
	}
	count(objects) > 0
	msg := sprintf("%s: %s", [
		_rule_text("capability"),
		concat("; ", [sprintf("%q", [o]) | some o in sort(objects)]),
	])
} else := {}

_listed_capability(f) if {
	some cap in object.get(_cfg, "capabilities", [])
	regex.match(cap.match, concat(" ", [f.term, f.object]))
}

# A generated matrix table row is checked against the rows it was generated from, not as prose.
_generated_violations(g) := {v |
	g.row.status == "supported"
	not _generated_backed(g.row)
	v := {
		"code": "claims_generated_mismatch",
		"severity": "error",
		"message": sprintf("%s (%s)", [_rule_text("generated"), _matrix_note]),
		"evidence": {"text": g.text, "citations": []},
		"location": {"file": g.file, "line": g.line},
	}
}

_generated_backed(gr) if {
	some row in input.matrix
	row.status == "supported"
	row.adapter == gr.adapter
	object.get(row, "adapter_version", "") == gr.adapter_version
	sort(_row_formats(row)) == sort(gr.format)
	startswith(object.get(row, "fixture_digest", ""), gr.fixture)
}

# Every [Rnn] citation names an id defined in docs/references.md.
_unknown_citations(s) := {"claims_unknown_citation": msg} if {
	unknown := [id | some id in s.citations; not id in input.references]
	count(unknown) > 0
	msg := sprintf("cites %v, not defined in docs/references.md", [concat(", ", sort(unknown))])
} else := {}

# METADATA
# description: The claims vocabulary (systems, producers, lexicon), for the Python extractor.
# entrypoint: true
vocabulary := data.ckptgate.config.claims
