# Tests that an unclean inspection's refusal names each file and finding (findings.rego); helpers are in
# intake_test.rego.
package ckptgate.intake_test

import data.ckptgate.testdata_test as td

test_an_unclean_inspection_names_each_file_and_finding if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [
			{"code": "walk.fifo", "severity": "error", "path": "pipe", "message": "fifo refused", "evidence": {}},
			{"code": "walk.empty", "severity": "error", "path": "", "message": "the directory holds no files", "evidence": {}},
		]},
	]))
	some r in d.reasons
	r.code == "inspection_not_clean"
	r.message == "the inspection is not clean: pipe: fifo refused (walk.fifo); the directory holds no files (walk.empty)"
}

test_an_unclean_inspection_counts_the_findings_past_three if {
	f := {"code": "walk.fifo", "severity": "error", "message": "fifo refused", "evidence": {}}
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [object.union(f, {"path": sprintf("p%d", [i])}) |
			some i in numbers.range(1, 5)
		]},
	]))
	some r in d.reasons
	r.code == "inspection_not_clean"
	endswith(r.message, "p3: fifo refused (walk.fifo); and 2 more error finding(s)")
}
