# Tests of ckptgate.intake's info reasons for the mapping's declared config (hfargs.rego).
package ckptgate.intake_test

import data.ckptgate.intake

_hfargs_reasons(inp) := {r.code: r | some r in intake.info_reasons with input as inp}

test_what_is_declared_not_measured_is_said_in_words if {
	reasons := _hfargs_reasons({"hf_mapping": {
		"family": "llama",
		"declared_not_measured": ["rms_norm_eps: declared, not measured"],
		"megatron_args": {"args": "absent: declared, not measured", "agreed": []},
	}})
	r := reasons.hf_mapping_declared_not_measured
	contains(r.message, "rms_norm_eps: declared, not measured")
	r.evidence.megatron_args == "absent: declared, not measured"
	not reasons.hf_mapping_args_agreed
}

test_agreed_args_are_named if {
	reasons := _hfargs_reasons({"hf_mapping": {
		"family": "llama",
		"declared_not_measured": [],
		"megatron_args": {"args": "present: compared with the config", "agreed": [{"arg": "kv_channels"}]},
	}})
	reasons.hf_mapping_args_agreed.evidence.args == ["kv_channels"]
	not reasons.hf_mapping_declared_not_measured
}

test_no_mapping_no_reason if {
	reasons := _hfargs_reasons({})
	not reasons.hf_mapping_declared_not_measured
	not reasons.hf_mapping_args_agreed
}
