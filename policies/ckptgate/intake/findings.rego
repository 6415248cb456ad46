# How ckptgate.intake names the inspection's error findings in a refusal: by file, finding and
# code, so that the reason names its cause rather than a count.
package ckptgate.intake

default _findings_named := "the inspection reports it not clean without an error finding (see its pickle reports)"

# The first three error findings, then how many more.
_findings_named := concat("; ", array.concat(
	[_finding_named(f) | some i, f in _error_finding_details; i < 3],
	_more_findings,
)) if {
	count(_error_finding_details) > 0
}

default _more_findings := []

_more_findings := [sprintf("and %d more error finding(s)", [count(_error_finding_details) - 3])] if {
	count(_error_finding_details) > 3
}

_finding_named(f) := sprintf("%s (%s)", [f.message, f.code]) if f.path == ""

_finding_named(f) := sprintf("%s: %s (%s)", [f.path, f.message, f.code]) if f.path != ""

_error_finding_details := [_finding_detail(f) |
	some f in object.get(input, ["inspection", "findings"], [])
	f.severity == "error"
]

_finding_detail(f) := {"code": f.code, "path": object.get(f, "path", ""), "message": object.get(f, "message", "")}
