# METADATA
# title: ckptgate.intake
# description: >-
#   The intake decision. The default is deny; allow holds only when no deny reason exists.
#   The plane is the highest risk class among input.inspection.loaders (pure_data <
#   static_pickle < framework). Each class names the evidence it needs in
#   data.ckptgate.config.loaders: pure data needs a clean inspection; the static pickle reader
#   also needs every pickle global in the allowlist; a framework deserializer also needs a
#   trusted attestation for this exact fixture digest, a producer-version gate and the
#   containment controls of its class. Actions (data.ckptgate.config.intake) may require a
#   trusted attestation even for pure data: intake (publishing) does by default. Containment
#   limits what a loader can reach; it is not proof that deserialization is safe [R28, R30].
package ckptgate.intake

import data.ckptgate.gates
import data.ckptgate.trust

# METADATA
# description: >-
#   The decision document, exactly {allow, plane, permitted_loaders, required_controls,
#   reasons, refusal, companions, selection}. Reasons list deny reasons first, then info
#   reasons; each carries its severity.
# entrypoint: true
decision := {
	"allow": allow,
	"plane": plane,
	"permitted_loaders": permitted_loaders,
	"required_controls": required_controls,
	"reasons": reasons,
	"refusal": refusal,
	"companions": companions,
	"selection": selection,
}

# METADATA
# description: >-
#   What a deny stands for, which sets the exit code of every command alike: "input" (4) when a
#   deny reason is about the checkpoint's own content; else "verification" (5) when failed or
#   untrusted signatures alone explain it; else "policy" (3). null when allowed.
# scope: document
default refusal := null

refusal := refusal_of(deny_reasons) if not allow

# METADATA
# description: The refusal class of a set of deny reasons (config/intake/data.json refusal).
refusal_of(denied) := "input" if {
	some r in denied
	r.code in _intake_cfg.refusal.input
} else := "verification" if {
	some r in denied
	r.code in _intake_cfg.refusal.verification
	every r2 in denied {
		_explained_by_verification(r2.code)
	}
} else := "policy"

_explained_by_verification(code) if code in _intake_cfg.refusal.verification

_explained_by_verification(code) if code in _intake_cfg.refusal.verification_consequences

# METADATA
# description: True only when the plane is known and there is no deny reason.
# scope: document
default allow := false

allow if {
	is_string(plane)
	count(deny_reasons) == 0
}

# METADATA
# description: All reasons, deny first, each sorted, each marked with its severity.
reasons := array.concat(
	[object.union(r, {"severity": "deny"}) | some r in sort(deny_reasons)],
	[object.union(r, {"severity": "info"}) | some r in sort(info_reasons)],
)

# METADATA
# description: The loaders the permit may name; empty unless allowed.
# scope: document
default permitted_loaders := []

permitted_loaders := sort(loaders) if allow

# METADATA
# description: >-
#   Controls the contained worker must have for the classes present: each class's
#   required_controls plus its optional controls that require_optional_controls names.
required_controls := sort(_required_control_set)

# METADATA
# description: Loaders the inspection says are needed.
loaders contains name if {
	is_array(input.inspection.loaders)
	some name in input.inspection.loaders
}

_loaders_cfg := data.ckptgate.config.loaders

_intake_cfg := data.ckptgate.config.intake

_unknown_loaders contains name if {
	some name in loaders
	not _loaders_cfg.loaders[name]
}

_classes contains class if {
	some name in loaders
	class := _loaders_cfg.loaders[name].class
}

# METADATA
# description: The evidence kinds that the classes present require.
evidence contains kind if {
	some class in _classes
	some kind in _loaders_cfg.classes[class].evidence
}

# METADATA
# description: The highest risk class among the loaders; null when a loader is unknown or none is named.
# scope: document
default plane := null

plane := _loaders_cfg.risk_order[max(_ranks)] if {
	count(loaders) > 0
	count(_unknown_loaders) == 0
}

_ranks contains rank if {
	some class in _classes
	some rank, name in _loaders_cfg.risk_order
	name == class
}

_required_control_set contains control if {
	some class in _classes
	some control in _loaders_cfg.classes[class].required_controls
}

_required_control_set contains control if {
	some class in _classes
	some control in _loaders_cfg.classes[class].optional_controls
	control in _loaders_cfg.require_optional_controls
}

# METADATA
# description: The request's action settings; null for an unknown action.
# scope: document
default action := null

action := _intake_cfg.actions[input.request.action] if is_string(input.request.action)

_now_ns := trust.time_ns(object.get(input, ["request", "now"], null))

# METADATA
# description: The adapter that the inspected format maps to; null when unknown or not consolidatable.
# scope: document
default adapter := null

adapter := data.ckptgate.config.gates.formats[input.inspection.format].adapter if is_string(input.inspection.format)

# METADATA
# description: The gate for this request's adapter, or null.
gate := gates.gate(adapter, data.ckptgate.config)

_format := object.get(input, ["inspection", "format"], null)

_format_known if data.ckptgate.config.gates.formats[input.inspection.format]

# METADATA
# description: Deny reasons. Each is written as the negation of the evidence it needs.
# scope: document
deny_reasons contains reason if {
	action == null
	reason := _reason("request_invalid", "the request names no known action", {
		"field": "request.action",
		"value": object.get(input, ["request", "action"], null),
		"known_actions": object.keys(_intake_cfg.actions),
	})
}

deny_reasons contains reason if {
	_now_ns == null
	reason := _reason("request_invalid", "the request time request.now is not an RFC 3339 time", {
		"field": "request.now",
		"value": object.get(input, ["request", "now"], null),
	})
}

deny_reasons contains reason if {
	_containment_needed
	not input.containment.preflighted == true
	reason := _reason(
		"containment_not_preflighted",
		"the loaders need containment controls, but the containment profile was not preflighted on this host",
		{"preflighted": object.get(input, ["containment", "preflighted"], null), "required": required_controls},
	)
}

deny_reasons contains reason if {
	some control in _required_control_set
	not input.containment.controls[control] == true
	reason := _reason(
		"containment_control_missing",
		sprintf("the %v plane requires the containment control %v; the preflight did not confirm it", [plane, control]),
		{"control": control, "observed": object.get(input, ["containment", "controls", control], null)},
	)
}

deny_reasons contains reason if {
	some reason in structural_deny_reasons
}

deny_reasons contains reason if {
	some field in _decision_fields
	reason := _malformed(field)
}

# METADATA
# description: >-
#   The fields whose type the decision relies on, with the JSON type each must have. A fact of
#   another type is a deny (input_malformed), never read as absent or false: Python always sends
#   these types, so any other is a broken caller, and the decision fails closed on it.
_structural_fields := [
	{"path": ["inspection", "clean"], "type": "boolean"},
	{"path": ["inspection", "consolidatable"], "type": "boolean"},
	{"path": ["inspection", "findings"], "type": "array"},
	{"path": ["inspection", "loaders"], "type": "array"},
	{"path": ["request", "target"], "type": "string"},
]

_decision_fields := [
	{"path": ["fixture", "digest"], "type": "string"},
	{"path": ["attestations"], "type": "array"},
	{"path": ["rejected_attestations"], "type": "array"},
]

_malformed(field) := _type_reason(concat(".", field.path), found, field.type) if {
	found := type_name(object.get(input, field.path, null))
	found != field.type
}

_type_reason(field, found, expected) := _reason(
	"input_malformed",
	sprintf("input.%v is of type %v, not %v", [field, found, expected]),
	{"field": field, "type": found, "expected": expected},
)

# METADATA
# description: >-
#   Deny reasons that follow from the checkpoint's structure and the request alone: the format,
#   the inspection's findings, the loaders and the pickle reports. No digest, attestation or
#   containment can cure them, so the precheck refuses on them before anything is hashed.
# scope: document
structural_deny_reasons contains reason if {
	not _format_known
	reason := _reason(
		"format_unknown",
		sprintf("the inspected format %v is not one this policy knows", [_format]),
		{"format": _format, "known_formats": object.keys(data.ckptgate.config.gates.formats)},
	)
}

structural_deny_reasons contains reason if {
	_format_known
	adapter == null
	note := object.get(data.ckptgate.config.gates.formats[_format], "note", "it has no adapter")
	reason := _reason(
		"format_not_consolidatable",
		sprintf("format %v cannot be consolidated: %v", [_format, note]),
		{"format": _format},
	)
}

structural_deny_reasons contains reason if {
	some field in _structural_fields
	reason := _malformed(field)
}

structural_deny_reasons contains reason if {
	is_array(input.inspection.findings)
	some i, finding in input.inspection.findings
	not is_object(finding)
	reason := _type_reason(sprintf("inspection.findings[%d]", [i]), type_name(finding), "object")
}

structural_deny_reasons contains reason if {
	input.inspection.consolidatable == false
	reason := _reason(
		"format_not_consolidatable",
		sprintf("the inspection reports that this %v checkpoint cannot be consolidated", [_format]),
		{"format": _format, "consolidatable": false},
	)
}

structural_deny_reasons contains reason if {
	not _inspection_clean
	reason := _reason(
		"inspection_not_clean",
		sprintf("the inspection is not clean: %s", [_findings_named]),
		{"clean": object.get(input, ["inspection", "clean"], null), "findings": _error_findings},
	)
}

structural_deny_reasons contains reason if {
	count(loaders) == 0
	reason := _reason(
		"loaders_missing",
		"the inspection names no loader, so nothing could be loaded",
		{"loaders": object.get(input, ["inspection", "loaders"], null)},
	)
}

structural_deny_reasons contains reason if {
	some name in _unknown_loaders
	reason := _reason(
		"unknown_loader",
		sprintf("loader %v is not in the policy's loader table, so it has no risk class", [name]),
		{"loader": name},
	)
}

structural_deny_reasons contains reason if {
	is_string(input.request.target)
	some name in loaders
	targets := _loaders_cfg.loaders[name].targets
	not input.request.target in targets
	reason := _reason(
		"loader_not_consolidatable",
		sprintf("loader %v cannot produce the requested target %v", [name, input.request.target]),
		{"loader": name, "target": input.request.target, "targets": targets},
	)
}

structural_deny_reasons contains reason if {
	"pickle_allowlist" in evidence
	not _pickle_reports_present
	reason := _reason(
		"pickle_report_missing",
		"a static-pickle loader is needed, but the inspection carries no pickle reports (inspection.pickles)",
		{"field": "inspection.pickles"},
	)
}

structural_deny_reasons contains reason if {
	"pickle_allowlist" in evidence
	some path, report in input.inspection.pickles
	not _resume_state(report)
	not _pickle_report_ok(report)
	reason := _reason(
		"pickle_outside_allowlist",
		sprintf("the static reader reports pickle %v as incomplete or outside its allowlist", [path]),
		{
			"path": path,
			"context": object.get(report, "context", null),
			"complete": object.get(report, "complete", null),
			"inside_allowlist": object.get(report, "inside_allowlist", null),
		},
	)
}

structural_deny_reasons contains reason if {
	"pickle_allowlist" in evidence
	some path, report in input.inspection.pickles
	not _resume_state(report)
	some name in _pickle_names(report)
	not name in _loaders_cfg.pickle_allowlist
	reason := _reason(
		"pickle_global_not_allowlisted",
		sprintf("pickle %v names the global %v, which is not in the policy's pickle allowlist", [path, name]),
		{"path": path, "global": name},
	)
}

# METADATA
# description: >-
#   The answer before the fixture is hashed, from input.inspection and input.request only:
#   {refuse, reasons, refusal}. refuse is true when a structural deny reason holds, and the caller then
#   stops measuring [attack catalogue: cheap structural checks before any full hash]. It never
#   allows anything; only the decision does.
# entrypoint: true
precheck := {
	"refuse": count(structural_deny_reasons) > 0,
	"reasons": [object.union(r, {"severity": "deny"}) | some r in sort(structural_deny_reasons)],
	"refusal": _precheck_refusal,
}

default _precheck_refusal := null

_precheck_refusal := refusal_of(structural_deny_reasons) if count(structural_deny_reasons) > 0

# METADATA
# description: Info reasons. They never change allow.
# scope: document
info_reasons contains reason if {
	is_string(plane)
	reason := _reason(
		"plane_selected",
		sprintf("the load plane is %v, the highest risk class among the loaders %v", [plane, sort(loaders)]),
		{"plane": plane, "loaders": sort(loaders), "evidence_required": sort(evidence)},
	)
}

info_reasons contains reason if {
	some class in _classes
	some control in _loaders_cfg.classes[class].optional_controls
	not control in _required_control_set
	not input.containment.controls[control] == true
	reason := _reason(
		"containment_optional_control_absent",
		sprintf("the optional control %v is absent on this host; policy data does not require it", [control]),
		{"control": control, "observed": object.get(input, ["containment", "controls", control], null)},
	)
}

# Every applied finding exception is reported, never silent.
info_reasons contains reason if {
	some f in _error_findings
	some exception in _intake_cfg.finding_exceptions
	_exception_applies(exception, f, input.inspection.format)
	reason := _reason(
		"finding_excepted",
		sprintf("the finding %v in %v is excepted by policy data (%v): %v", [f.code, f.path, exception.id, exception.why]),
		{"exception": exception.id, "code": f.code, "path": f.path},
	)
}

_inspection_clean if input.inspection.clean == true

# Python reports not clean only because of findings that policy data explicitly excepts:
# every error finding is excepted, and every pickle report is complete and inside its allowlist.
_inspection_clean if {
	input.inspection.clean == false
	count(_error_findings) > 0
	every f in _error_findings {
		_excepted(f)
	}
	every report in object.get(input, ["inspection", "pickles"], {}) {
		_pickle_report_ok(report)
	}
}

_excepted(finding) if {
	some exception in _intake_cfg.finding_exceptions
	_exception_applies(exception, finding, input.inspection.format)
}

# A code-bearing finding (a dynamic-module reference in a companion) is never excepted, whoever
# wrote the exception: policy data lists those codes in code_bearing_findings.
_exception_applies(exception, finding, format) if {
	format in exception.formats
	finding.code == exception.code
	finding.path in exception.paths
	not finding.code in _code_bearing_codes
	_exception_admissible(exception)
}

# A bundled exception may name any finding that bears no code; one a policy-data overlay added
# (marked by ckptgate when it merges) only a code the bundled data marks exceptable.
_exception_admissible(exception) if not exception.overlay

_exception_admissible(exception) if exception.code in _intake_cfg.exceptable_codes

_code_bearing_codes contains code if some code in object.get(_intake_cfg, ["code_bearing_findings", "codes"], [])

_pickle_reports_present if is_object(input.inspection.pickles)

_pickle_names(report) := {name | some name in object.get(report, "globals", [])} | {call.target |
	some call in object.get(report, "calls", [])
}

_error_findings := [{"code": f.code, "path": object.get(f, "path", null)} |
	some f in object.get(input, ["inspection", "findings"], [])
	f.severity == "error"
]

_containment_needed if "containment" in evidence

_containment_needed if count(_required_control_set) > 0

_reason(code, message, ev) := {"code": code, "message": message, "evidence": ev}
