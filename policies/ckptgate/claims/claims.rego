# METADATA
# title: ckptgate.claims
# description: >-
#   The claims lint over documentation sentences (input.sentences: file, line, text,
#   citations), the register ids defined in docs/references.md (input.references) and the
#   generated support matrix rows (input.matrix). Each rule applies one of the register's claim
#   rules 1-7; the vocabulary is policy data (data.ckptgate.config.claims). A sentence that
#   negates a claim ("not", "never", ...) does not make it, so bounded wording passes.
#   Violations are objects {code, message, evidence, location}.
package ckptgate.claims

_cfg := data.ckptgate.config.claims

_pattern(name) := _cfg.patterns[name]

_has(name, text) if regex.match(_pattern(name), text)

_negated(text) if _has("negation", text)

_violation(code, message, s) := {
	"code": code,
	"message": message,
	"evidence": {"text": s.text, "citations": object.get(s, "citations", [])},
	"location": {"file": s.file, "line": s.line},
}

# METADATA
# description: Every violation of claim rules 1-7 and of citation existence, as objects.
# entrypoint: true
violations contains v if {
	some s in input.sentences
	some v in _sentence_violations(s)
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
	_rule5_containment(s),
	_rule6_trust(s),
	_rule7_os_controls(s),
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

# Rule 1: vendor behaviour is what a vendor documents, defines or currently implements.
_rule1_vendor_verb(s) := {"claims_vendor_phrasing": msg} if {
	_vendor_cited(s)
	not _has("vendor_verb", s.text)
	msg := concat(" ", [
		"a sentence citing vendor sources must phrase their behaviour",
		"as documents, defines or currently implements (rule 1)",
	])
} else := {}

# Rule 1: vendor documentation is never turned into a ckptgate support claim.
_rule1_vendor_support(s) := {"claims_vendor_as_support": msg} if {
	_vendor_cited(s)
	_has("support_claim", s.text)
	not _negated(s.text)
	msg := concat(" ", [
		"a sentence citing vendor documentation must not claim ckptgate support;",
		"support comes from the matrix (rule 1)",
	])
} else := {}

# Rule 2: device_map is not checkpoint-rank topology; such statements are marked as our interpretation.
_rule2_interpretation(s) := {"claims_unmarked_interpretation": msg} if {
	_has("device_map", s.text)
	not _has("interpretation", s.text)
	msg := "a sentence about device_map must mark the project interpretation explicitly (rule 2)"
} else := {}

# Rule 3: a support claim names a supported matrix row, or points at the generated matrix.
_rule3_support(s) := {"claims_support_not_in_matrix": msg} if {
	_has("support_claim", s.text)
	not _negated(s.text)
	not _has("support_pointer", s.text)
	not _names_supported_row(s.text)
	msg := "a support claim must name a row the support matrix marks supported, or point to the matrix (rule 3)"
} else := {}

_names_supported_row(text) if {
	some row in input.matrix
	row.status == "supported"
	some term in _row_terms(row)
	contains(_normal(text), _normal(term))
}

_row_terms(row) := [t |
	some key in ["format", "adapter"]
	t := object.get(row, key, null)
	is_string(t)
	t != ""
]

_normal(text) := regex.replace(lower(text), `[-_\s]+`, " ")

# Rule 4: archived or versioned documentation is historical evidence only.
_rule4_historical(s) := {"claims_archived_not_historical": msg} if {
	_has("archived_doc", s.text)
	not _has("historical", s.text)
	msg := "a link to archived or versioned documentation must be called historical evidence (rule 4)"
} else := {}

# Rule 5: containment controls are never called proof that deserialization is safe.
_rule5_containment(s) := {"claims_containment_as_proof": msg} if {
	_has("containment", s.text)
	_has("proof", s.text)
	not _negated(s.text)
	msg := "containment must not be called proof or a guarantee of safety (rule 5)"
} else := {}

# Rule 6: weights_only, a checksum or a filename is never sufficient trust.
_rule6_trust(s) := {"claims_surrogate_trust": msg} if {
	_has("trust_surrogate", s.text)
	_has("sufficient_trust", s.text)
	not _negated(s.text)
	msg := concat(" ", [
		"weights_only, a checksum or a filename must never be called",
		"sufficient trust or authenticity (rule 6)",
	])
} else := {}

# Rule 7: OS controls are exact-profile mechanisms, not a portable or universal sandbox.
_rule7_os_controls(s) := {"claims_portable_sandbox": msg} if {
	_has("os_control", s.text)
	_has("portable_sandbox", s.text)
	not _negated(s.text)
	msg := concat(" ", [
		"OS controls must be described as exact-profile containment,",
		"not a portable or universal sandbox (rule 7)",
	])
} else := {}

# Every [Rnn] citation names an id defined in docs/references.md.
_unknown_citations(s) := {"claims_unknown_citation": msg} if {
	unknown := [id | some id in s.citations; not id in input.references]
	count(unknown) > 0
	msg := sprintf("cites %v, not defined in docs/references.md", [concat(", ", sort(unknown))])
} else := {}
