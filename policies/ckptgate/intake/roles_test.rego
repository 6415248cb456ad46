# Tests of ckptgate.intake's roles (roles.rego): pure-data companions that travel to DST, and
# training resume state that is reported, never loaded or published [R19, R20]. Helpers such as
# _decide and _codes are in intake_test.rego.
package ckptgate.intake_test

import data.ckptgate.intake
import data.ckptgate.testdata_test as td

_trainer_files := [
	{"path": "config.json", "kind": "json", "size": 10, "detail": "json", "role": "companion"},
	{"path": "tokenizer.model", "kind": "unknown", "size": 10, "detail": "unknown", "role": "companion"},
	{"path": "model.safetensors", "kind": "safetensors", "size": 10, "detail": "safetensors"},
	{"path": "sub/config.json", "kind": "json", "size": 10, "detail": "json"},
	{"path": "training_args.bin", "kind": "torch_zip", "size": 10, "detail": "zip", "role": "resume_state"},
]

_resume_pickle(names) := {
	"context": "resume_state", "protocol": 2, "complete": true, "opcodes": {},
	"globals": names, "calls": [], "inside_allowlist": true, "plain_tensors": false,
}

_trainer_input(names) := json.patch(td.pure_data_input, [
	{"op": "replace", "path": "/inspection/files", "value": _trainer_files},
	{"op": "add", "path": "/inspection/pickles", "value": {"training_args.bin": _resume_pickle(names)}},
])

_trainer_args := ["transformers.training_args.TrainingArguments", "accelerate.state.PartialState"]

test_companions_travel_and_resume_state_is_reported if {
	d := _decide(_trainer_input(_trainer_args))
	d.allow == true
	d.companions == ["config.json", "tokenizer.model"]
	"resume_state_excluded" in _codes(d)
}

test_companions_stay_when_policy_data_says_so if {
	cfg := object.union(data.ckptgate.config.intake, {"companions": {"description": "x", "travel": false, "names": []}})
	d := intake.decision with input as _trainer_input(_trainer_args)
		with data.ckptgate.config.intake as cfg
		with data.ckptgate.config.trust as td.trust
	d.allow == true
	d.companions == []
}

test_resume_state_global_outside_its_allowlist_refuses_as_input if {
	d := _decide(_trainer_input(array.concat(_trainer_args, ["os.system"])))
	d.allow == false
	d.refusal == "input"
	d.companions == []
	some r in d.reasons
	r.code == "resume_state_global_not_allowlisted"
	r.evidence.global == "os.system"
	pre := intake.precheck with input as _trainer_input(["os.system"])
	pre.refuse == true
}

test_resume_state_is_not_held_to_the_model_pickle_allowlist if {
	static := {"op": "replace", "path": "/inspection/loaders", "value": ["json", "static_pickle"]}
	inp := json.patch(_trainer_input(_trainer_args), [static])
	d := _decide(inp)
	not "pickle_global_not_allowlisted" in _codes(d)
	not "pickle_outside_allowlist" in _codes(d)
}

test_a_file_not_named_in_policy_data_never_travels_as_a_companion if {
	code := {"path": "tokenizer.py", "kind": "code", "size": 10, "detail": "python source", "role": "companion"}
	files := array.concat(_trainer_files, [code])
	patch := [{"op": "replace", "path": "/inspection/files", "value": files}]
	d := _decide(json.patch(_trainer_input(_trainer_args), patch))
	not "tokenizer.py" in d.companions
	not "sub/config.json" in d.companions
}

test_a_deny_carries_no_companions if {
	patch := [{"op": "replace", "path": "/attestations", "value": []}]
	d := _decide(json.patch(_trainer_input(_trainer_args), patch))
	d.allow == false
	d.companions == []
}

test_resume_state_is_reported_only_for_files_with_that_role if {
	d := _decide(_trainer_input(_trainer_args))
	excluded := {r.evidence.path |
		some r in d.reasons
		r.code == "resume_state_excluded"
	}
	excluded == {"training_args.bin"}
}

test_with_hf_config_the_checkpoint_companions_stay_and_are_named if {
	inp := json.patch(_trainer_input(_trainer_args), [{
		"op": "add", "path": "/hf_mapping",
		"value": {"family": "llama", "config_sha256": "sha256:ab"},
	}])
	cs := intake.companions with input as inp
		with intake.allow as true
		with data.ckptgate.config.trust as td.trust
	cs == []
	infos := intake.info_reasons with input as inp with data.ckptgate.config.trust as td.trust
	named := {r.evidence.path | some r in infos; r.code == "hf_mapping_companion_not_published"}
	named == {"config.json", "tokenizer.model"}
}
