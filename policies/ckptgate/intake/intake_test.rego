# METADATA
# title: ckptgate.intake_test
# description: Table-driven tests for every intake reason code, and the decision shape.
package ckptgate.intake_test

import data.ckptgate.intake
import data.ckptgate.testdata_test as td

_decide(inp) := d if {
	d := intake.decision with input as inp with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.qualified as td.qualified
}

_codes(d) := {r.code | some r in d.reasons}

_pickle := {
	"context": "dcp_metadata", "protocol": 4, "complete": true, "opcodes": {},
	"globals": ["torch.Size", "pathlib.PosixPath"], "calls": [{"opcode": "REDUCE", "target": "torch.Size", "pos": 3}],
	"inside_allowlist": true, "plain_tensors": false,
}

_bad_call_pickle := object.union(_pickle, {"calls": [{"opcode": "REDUCE", "target": "os.system", "pos": 7}]})

_framework_controls := ["ipc_ns", "net_ns", "no_new_privs", "openat2", "rlimits", "seccomp", "user_ns"]

# Each deny code and one input that must produce it.
_deny_cases := {
	"request_invalid": td.with_value("/request/action", "launch"),
	"format_unknown": td.with_value("/inspection/format", "tensorflow-saved-model"),
	"format_not_consolidatable": td.with_value("/inspection/format", "fsdp-local"),
	"inspection_not_clean": td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [{
			"code": "input.pickle.global_not_allowed", "severity": "error",
			"path": "global_step2/mp_rank_00_model_states.pt", "message": "m", "evidence": {},
		}]},
	]),
	"loaders_missing": td.with_value("/inspection/loaders", []),
	"unknown_loader": td.with_value("/inspection/loaders", ["json", "numpy_load"]),
	"loader_not_consolidatable": td.with_value("/request/target", "gguf"),
	"input_malformed": td.with_value("/inspection/consolidatable", "no"),
	"pickle_report_missing": td.with_value("/inspection/loaders", ["deepspeed", "static_pickle"]),
	"pickle_outside_allowlist": td.patched([
		{"op": "replace", "path": "/inspection/loaders", "value": ["deepspeed", "static_pickle"]},
		{"op": "add", "path": "/inspection/pickles", "value": {".metadata": object.union(_pickle, {"complete": false})}},
	]),
	"pickle_global_not_allowlisted": td.patched([
		{"op": "replace", "path": "/inspection/loaders", "value": ["deepspeed", "static_pickle"]},
		{"op": "add", "path": "/inspection/pickles", "value": {".metadata": _bad_call_pickle}},
	]),
	"attestation_rejected": td.with_value("/rejected_attestations", [{
		"source": "attestations/tampered.intoto.json", "code": "verify.dsse.bad_signature",
		"message": "no trusted key verifies the signature",
	}]),
	"attestation_missing": td.with_value("/attestations", []),
	"attestation_malformed": td.patched([{"op": "remove", "path": "/attestations/0/statement/predicate/validity"}]),
	"attestation_untrusted_signer": td.with_value(
		"/attestations/0/signers/0/spki_sha256",
		concat("", ["c", substring(td.key_spki, 1, -1)]),
	),
	"attestation_digest_mismatch": td.with_value("/fixture/digest", concat(":", ["sha256", td.key_spki])),
	"attestation_predicate_mismatch": td.patched(td.co_subject_ops("/attestations/0")),
	"attestation_freshness_unchecked": td.with_value("/request/now", "yesterday"),
	"attestation_expired": td.with_value("/request/now", "2027-12-01T00:00:00Z"),
	"attestation_not_yet_valid": td.with_value("/request/now", "2026-10-01T00:00:00Z"),
	"attestation_wrong_commit": td.with_value("/request/candidate_commit", "2222222222222222222222222222222222222222"),
	"attestation_wrong_predicate_type": td.with_value("/attestations/0/statement/predicateType", td.provenance),
	"attestation_adapter_mismatch": td.with_value("/attestations/0/statement/predicate/adapter/name", "dcp"),
	"attestation_result_not_passed": td.with_value("/attestations/0/statement/predicate/result/status", "failed"),
	"producer_release_unqualified": td.with_value("/attestations/0/statement/predicate/producer/version", "0.18.0"),
	"topology_unqualified": td.with_value("/attestations/0/statement/predicate/topology/dp", 4),
	"containment_not_preflighted": td.with_value("/containment/preflighted", false),
	"containment_control_missing": td.with_value("/containment/controls/seccomp", false),
}

_denies(code) if {
	d := _decide(_deny_cases[code])
	d.allow == false
	d.permitted_loaders == []
	code in _codes(d)
}

test_every_deny_case_denies_with_its_code if {
	every code, _ in _deny_cases {
		_denies(code)
	}
}

test_every_deny_case_changes_the_allowed_input if {
	_decide(td.framework_input).allow == true
	every inp in _deny_cases {
		inp != td.framework_input
	}
}

test_allow_framework_with_trusted_qualification_gate_and_controls if {
	d := _decide(td.framework_input)
	d.allow == true
	d.plane == "framework"
	d.permitted_loaders == ["deepspeed", "json"]
	d.required_controls == _framework_controls
	_codes(d) == {"attestation_trusted", "containment_optional_control_absent", "plane_selected"}
}

test_decision_has_exactly_the_contract_keys if {
	d := _decide(td.framework_input)
	object.keys(d) == {
		"allow", "plane", "permitted_loaders", "required_controls",
		"reasons", "refusal", "companions", "selection",
	}
	every r in d.reasons {
		object.keys(r) == {"code", "message", "evidence", "severity"}
		r.severity in {"deny", "info"}
		is_string(r.message)
		is_object(r.evidence)
	}
}

test_deny_reasons_come_before_info_reasons if {
	d := _decide(td.with_value("/containment/controls/seccomp", false))
	d.reasons[0].code == "containment_control_missing"
	d.reasons[count(d.reasons) - 1].code == "plane_selected"
}

test_deny_when_request_invalid_action if _denies("request_invalid")

test_deny_when_request_time_missing if {
	d := _decide(td.patched([{"op": "remove", "path": "/request/now"}]))
	d.allow == false
	some r in d.reasons
	r.code == "request_invalid"
	r.evidence.field == "request.now"
}

test_deny_when_format_unknown if _denies("format_unknown")

test_deny_when_format_not_consolidatable if _denies("format_not_consolidatable")

test_deny_when_inspection_reports_not_consolidatable if {
	d := _decide(td.with_value("/inspection/consolidatable", false))
	d.allow == false
	"format_not_consolidatable" in _codes(d)
}

test_deny_when_inspection_not_clean if {
	_denies("inspection_not_clean")
	some r in _decide(_deny_cases.inspection_not_clean).reasons
	r.code == "inspection_not_clean"
	r.evidence.findings == [{"code": "input.pickle.global_not_allowed", "path": "global_step2/mp_rank_00_model_states.pt"}]
}

test_deny_when_inspection_clean_flag_missing if {
	d := _decide(td.patched([{"op": "remove", "path": "/inspection/clean"}]))
	d.allow == false
	"inspection_not_clean" in _codes(d)
}

test_deny_when_loaders_missing if {
	_denies("loaders_missing")
	_decide(_deny_cases.loaders_missing).plane == null
}

test_deny_when_unknown_loader if {
	_denies("unknown_loader")
	_decide(_deny_cases.unknown_loader).plane == null
}

test_deny_when_loader_not_consolidatable if _denies("loader_not_consolidatable")

test_deny_when_pickle_report_missing if _denies("pickle_report_missing")

test_deny_when_pickle_outside_allowlist if _denies("pickle_outside_allowlist")

test_deny_when_pickle_global_not_allowlisted if {
	_denies("pickle_global_not_allowlisted")
	d := _decide(_deny_cases.pickle_global_not_allowlisted)
	{r.evidence.global | some r in d.reasons; r.code == "pickle_global_not_allowlisted"} == {"os.system"}
}

test_deny_when_containment_not_preflighted if _denies("containment_not_preflighted")

test_deny_when_containment_profile_absent if {
	d := _decide(td.with_value("/containment", null))
	d.allow == false
	"containment_not_preflighted" in _codes(d)
	count([r | some r in d.reasons; r.code == "containment_control_missing"]) == count(_framework_controls)
}

test_deny_when_containment_control_missing if {
	_denies("containment_control_missing")
	some r in _decide(_deny_cases.containment_control_missing).reasons
	r.code == "containment_control_missing"
	r.evidence == {"control": "seccomp", "observed": false}
}

test_deny_when_ipc_namespace_missing if {
	d := _decide(td.with_value("/containment/controls/ipc_ns", false))
	d.allow == false
	"ipc_ns" in d.required_controls
	some r in d.reasons
	r.code == "containment_control_missing"
	r.evidence == {"control": "ipc_ns", "observed": false}
}

test_allow_without_pid_namespace_unless_policy_data_requires_it if {
	without := td.with_value("/containment/controls/pid_ns", false)
	_decide(without).allow == true
	d := _decide(without) with data.ckptgate.config.loaders.require_optional_controls as ["pid_ns"]
	d.allow == false
	"pid_ns" in d.required_controls
}

test_deny_cgroup_v2_absent_when_policy_data_requires_it if {
	d := _decide(td.framework_input) with data.ckptgate.config.loaders.require_optional_controls as ["cgroup_v2"]
	d.allow == false
	"cgroup_v2" in d.required_controls
	some r in d.reasons
	r.code == "containment_control_missing"
	r.evidence.control == "cgroup_v2"
}

test_default_deny_on_empty_input if {
	d := _decide({})
	d.allow == false
	d.plane == null
	d.permitted_loaders == []
	{"request_invalid", "format_unknown", "inspection_not_clean", "loaders_missing"} - _codes(d) == set()
}

test_deny_without_trust_data if {
	d := intake.decision with input as td.framework_input with data.ckptgate.config.trust as {}
	d.allow == false
	"attestation_untrusted_signer" in _codes(d)
}

test_static_pickle_plane_allowed_with_allowlisted_globals if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/format", "value": "dcp-torch-save"},
		{"op": "replace", "path": "/inspection/loaders", "value": ["static_pickle"]},
		{"op": "add", "path": "/inspection/pickles", "value": {".metadata": _pickle}},
		{"op": "replace", "path": "/attestations/0/statement/predicateType", "value": td.provenance},
		{"op": "replace", "path": "/attestations/0/statement/predicate/producer", "value": _torch("2.13.0")},
	]))
	d.allow == true
	d.plane == "static_pickle"
}

test_plane_is_the_highest_risk_class if {
	d := _decide(td.with_value("/inspection/loaders", ["safetensors", "static_pickle", "torch_load"]))
	d.plane == "framework"
}

_helper_script_finding(path) := {
	"code": "classify.code", "severity": "error", "path": path,
	"message": "code in the checkpoint", "evidence": {},
}

test_allow_when_only_excepted_deepspeed_helper_scripts_are_found if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [
			_helper_script_finding("zero_to_fp32.py"),
			_helper_script_finding("zero_to_torch.py"),
		]},
	]))
	d.allow == true
	excepted := {r.evidence.path | some r in d.reasons; r.code == "finding_excepted"; r.severity == "info"}
	excepted == {"zero_to_fp32.py", "zero_to_torch.py"}
}

test_deny_when_code_is_found_outside_the_excepted_paths if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [
			_helper_script_finding("zero_to_fp32.py"),
			_helper_script_finding("global_step2/evil.py"),
		]},
	]))
	d.allow == false
	"inspection_not_clean" in _codes(d)
}

test_deny_when_the_exception_names_another_format if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/format", "value": "fsdp-full"},
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [_helper_script_finding("zero_to_fp32.py")]},
	]))
	"inspection_not_clean" in _codes(d)
}

test_deny_when_an_excepted_finding_comes_with_a_pickle_outside_the_allowlist if {
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [_helper_script_finding("zero_to_fp32.py")]},
		{"op": "add", "path": "/inspection/pickles", "value": {"a.pt": {"complete": true, "inside_allowlist": false}}},
	]))
	"inspection_not_clean" in _codes(d)
}

_code_ref_finding(code, path) := {
	"code": code, "severity": "error", "path": path,
	"message": "names custom code", "evidence": {},
}

# An exception written for a code-bearing finding (as an overlay would add it) never applies.
test_code_bearing_findings_are_never_excepted if {
	some code in ["config.auto_map", "config.custom_pipelines", "config.dynamic_module_ref"]
	code in data.ckptgate.config.intake.code_bearing_findings.codes
	exceptions := array.concat(data.ckptgate.config.intake.finding_exceptions, [{
		"id": "admit-my-code", "formats": ["deepspeed-zero2"], "code": code,
		"paths": ["config.json"], "why": "an overlay that tries to admit its own auto_map",
	}])
	inp := td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [_code_ref_finding(code, "config.json")]},
	])
	d := _decide(inp) with data.ckptgate.config.intake.finding_exceptions as exceptions
	d.allow == false
	"inspection_not_clean" in _codes(d)
	not "finding_excepted" in _codes(d)
}

# The same exception for a finding that is not code-bearing does apply (the test above can fail).
test_an_exception_for_another_code_still_applies if {
	exceptions := array.concat(data.ckptgate.config.intake.finding_exceptions, [{
		"id": "odd-json", "formats": ["deepspeed-zero2"], "code": "json.duplicate_key",
		"paths": ["config.json"], "why": "a test of the exception mechanism itself",
	}])
	inp := td.patched([
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [_code_ref_finding("json.duplicate_key", "config.json")]},
	])
	d := _decide(inp) with data.ckptgate.config.intake.finding_exceptions as exceptions
	d.allow == true
	"finding_excepted" in _codes(d)
}

_precheck(inp) := p if {
	p := intake.precheck with input as inp with data.ckptgate.config.trust as td.trust
}

_structural_codes := {
	"format_unknown", "format_not_consolidatable", "inspection_not_clean", "input_malformed", "loaders_missing",
	"unknown_loader",
	"loader_not_consolidatable", "pickle_report_missing", "pickle_outside_allowlist", "pickle_global_not_allowlisted",
}

test_precheck_refuses_exactly_the_structural_deny_cases if {
	every code, inp in _deny_cases {
		structural := code in _structural_codes
		_precheck(inp).refuse == structural
	}
}

test_precheck_refusals_carry_their_code_as_deny_reasons if {
	every code in _structural_codes {
		some r in _precheck(_deny_cases[code]).reasons
		r.code == code
		r.severity == "deny"
	}
}

test_precheck_passes_a_checkpoint_before_its_fixture_and_attestations_are_known if {
	inp := td.patched([
		{"op": "remove", "path": "/fixture"},
		{"op": "replace", "path": "/attestations", "value": []},
		{"op": "remove", "path": "/containment"},
	])
	_precheck(inp) == {"refuse": false, "reasons": [], "refusal": null}
	_decide(inp).allow == false
}

test_precheck_refuses_on_an_empty_input if {
	p := _precheck({})
	p.refuse == true
	{r.code | some r in p.reasons} == {"format_unknown", "inspection_not_clean", "input_malformed", "loaders_missing"}
}

# A fact of the wrong type is a deny, never read as absent or false: each of these used to allow.
_malformed_cases := [
	["/inspection/consolidatable", 0, true],
	["/inspection/consolidatable", null, true],
	["/inspection/clean", "true", true],
	["/inspection/findings", {"a": 1}, true],
	["/inspection/findings", null, true],
	["/inspection/loaders", "deepspeed", true],
	["/request/target", null, true],
	["/request/target", ["hf-sharded-safetensors"], true],
	["/attestations", null, false],
	["/attestations", 1, false],
	["/rejected_attestations", {}, false],
	["/fixture/digest", 7, false],
]

test_a_finding_that_is_not_an_object_is_input_malformed if {
	every finding in [0, "inspection.error", [], null] {
		inp := td.with_value("/inspection/findings", [finding])
		"input_malformed" in _codes(_decide(inp))
		_precheck(inp).refuse == true
	}
}

test_a_fact_of_the_wrong_type_is_input_malformed if {
	every case in _malformed_cases {
		[path, value, structural] := case
		inp := td.with_value(path, value)
		d := _decide(inp)
		d.allow == false
		some r in d.reasons
		r.code == "input_malformed"
		r.evidence.field == concat(".", array.slice(split(path, "/"), 1, 10))
		_precheck(inp).refuse == structural
	}
}

# One rule sets what a deny stands for, and so the exit code, whichever command asks.
test_an_allow_has_no_refusal if {
	_decide(td.framework_input).refusal == null
}

test_the_checkpoints_own_content_is_an_input_refusal_whatever_else_fails if {
	every code in ["inspection_not_clean", "pickle_outside_allowlist", "pickle_global_not_allowlisted"] {
		_decide(_deny_cases[code]).refusal == "input"
	}
	both := json.patch(_deny_cases.inspection_not_clean, [{"op": "replace", "path": "/attestations", "value": []}])
	_decide(both).refusal == "input"
}

test_failed_or_untrusted_signatures_alone_are_a_verification_refusal if {
	every code in ["attestation_rejected", "attestation_untrusted_signer", "attestation_digest_mismatch"] {
		_decide(_deny_cases[code]).refusal == "verification"
	}
	bad_signature_only := json.patch(
		_deny_cases.attestation_rejected,
		[{"op": "replace", "path": "/attestations", "value": []}],
	)
	d := _decide(bad_signature_only)
	{"attestation_rejected", "attestation_missing"} == _codes(d) & {"attestation_rejected", "attestation_missing"}
	d.refusal == "verification"
}

test_any_other_reason_beside_a_verification_failure_is_a_policy_refusal if {
	_decide(_deny_cases.attestation_missing).refusal == "policy"
	_decide(_deny_cases.attestation_expired).refusal == "policy"
	_decide(_deny_cases.containment_control_missing).refusal == "policy"
	mixed := json.patch(
		_deny_cases.attestation_rejected,
		[{"op": "replace", "path": "/containment/controls/seccomp", "value": false}],
	)
	_decide(mixed).refusal == "policy"
}

test_the_precheck_names_its_refusal_too if {
	_precheck(_deny_cases.inspection_not_clean).refusal == "input"
	_precheck(_deny_cases.format_unknown).refusal == "policy"
}

_overlay_exception(code) := {
	"id": "acme", "formats": ["deepspeed-zero3"], "code": code,
	"paths": ["evil.py"], "why": "an exception a policy-data overlay added", "overlay": true,
}

_error_finding(code, path) := {"code": code, "severity": "error", "path": path, "message": "m", "evidence": {}}

_with_overlay_exception(code) := d if {
	exceptions := array.concat(data.ckptgate.config.intake.finding_exceptions, [_overlay_exception(code)])
	d := _decide(td.patched([
		{"op": "replace", "path": "/inspection/format", "value": "deepspeed-zero3"},
		{"op": "replace", "path": "/inspection/clean", "value": false},
		{"op": "replace", "path": "/inspection/findings", "value": [_error_finding(code, "evil.py")]},
	])) with data.ckptgate.config.intake.finding_exceptions as exceptions
}

test_an_overlay_exception_never_admits_a_code_bearing_finding if {
	d := _with_overlay_exception("classify.code")
	d.allow == false
	"inspection_not_clean" in _codes(d)
}

test_an_overlay_exception_admits_an_exceptable_finding if {
	d := _with_overlay_exception("classify.extension_mismatch")
	d.allow == true
}
