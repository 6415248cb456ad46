# Files beside the model, for ckptgate.intake: pure-data companions, which travel to DST byte for
# byte when policy data lets them, and training resume state (Trainer checkpoint-N, Accelerate
# save_state), which is inspected and reported but never loaded or published [R19, R20].
package ckptgate.intake

# METADATA
# description: >-
#   The pure-data companion files (config, generation config, tokenizer files) that travel to DST
#   byte for byte: files at the top of the checkpoint whose name policy data lists and whose
#   content Python checked (role "companion"). Empty unless allowed, or when policy data says they
#   do not travel.
# scope: document
default companions := []

companions := sort([f.path |
	some f in input.inspection.files
	object.get(f, "role", null) == "companion"
	f.path in _intake_cfg.companions.names
]) if {
	allow
	_intake_cfg.companions.travel == true
	not _hf_mapping_requested
}

# With --hf-config the published config and tokenizer files are the config's, never the
# checkpoint's: its companions do not travel, and the decision names each one it leaves behind.
_hf_mapping_requested if is_string(input.hf_mapping.family)

# Resume state (optimizer, scheduler, RNG state, training arguments) is never loaded or published,
# but a global outside what its producers write is a sign of tampering: the whole intake is refused.
structural_deny_reasons contains reason if {
	some path, report in object.get(input, ["inspection", "pickles"], {})
	_resume_state(report)
	some name in _pickle_names(report)
	not name in _loaders_cfg.resume_state_allowlist
	reason := _reason(
		"resume_state_global_not_allowlisted",
		sprintf("resume state %v names the global %v, which its producers do not write; refused as tampering", [path, name]),
		{"path": path, "global": name},
	)
}

info_reasons contains reason if {
	some f in object.get(input, ["inspection", "files"], [])
	object.get(f, "role", null) == "resume_state"
	reason := _reason(
		"resume_state_excluded",
		sprintf("%v is training resume state: reported, never loaded or published", [f.path]),
		{"path": f.path},
	)
}

info_reasons contains reason if {
	_hf_mapping_requested
	some f in object.get(input, ["inspection", "files"], [])
	object.get(f, "role", null) == "companion"
	reason := _reason(
		"hf_mapping_companion_not_published",
		sprintf(
			concat(" ", [
				"%v is a companion of the checkpoint; with --hf-config the published config and tokenizer",
				"files are the config's (%v), so it is not published",
			]),
			[f.path, object.get(input.hf_mapping, "config_sha256", null)],
		),
		{"path": f.path, "config_sha256": object.get(input.hf_mapping, "config_sha256", null)},
	)
}

_resume_state(report) if report.context == "resume_state"

_pickle_report_ok(report) if {
	report.complete == true
	report.inside_allowlist == true
}
