# METADATA
# title: ckptgate.gates_test
# description: Tests for the producer-version gates.
package ckptgate.gates_test

import data.ckptgate.gates

_g(adapter) := gates.gate(adapter, data.ckptgate.config.gates)

test_dcp_accepts_only_qualified_torch if {
	gates.passes({"name": "torch", "version": "2.13.0"}, _g("dcp"))
	gates.passes({"name": "torch", "version": "2.13.0+cpu"}, _g("dcp"))
	not gates.passes({"name": "torch", "version": "2.12.1"}, _g("dcp"))
	not gates.passes({"name": "torch", "version": "2.14.0"}, _g("dcp"))
	not gates.passes({"name": "torch", "version": "2.13.0a0+git1234"}, _g("dcp"))
}

test_deepspeed_zero_accepts_exactly_0_19_8 if {
	gates.passes({"name": "deepspeed", "version": "0.19.8"}, _g("deepspeed-zero"))
	not gates.passes({"name": "deepspeed", "version": "0.19.7"}, _g("deepspeed-zero"))
	not gates.passes({"name": "torch", "version": "0.19.8"}, _g("deepspeed-zero"))
}

test_megatron_torch_dist_accepts_exactly_0_16_1 if {
	gates.passes({"name": "megatron-core", "version": "0.16.1"}, _g("megatron-torch-dist"))
	not gates.passes({"name": "megatron-core", "version": "0.16.0"}, _g("megatron-torch-dist"))
}

test_peft_accepts_the_0_21_range if {
	gates.passes({"name": "peft", "version": "0.21.0"}, _g("peft"))
	gates.passes({"name": "peft", "version": "0.21.2"}, _g("peft"))
	not gates.passes({"name": "peft", "version": "0.22.0"}, _g("peft"))
	not gates.passes({"name": "peft", "version": "0.20.9"}, _g("peft"))
}

test_a_range_admits_releases_only if {
	gates.passes({"name": "peft", "version": "0.21.2+local"}, _g("peft")) # build metadata is ignored
	not gates.passes({"name": "peft", "version": "0.22.0-rc1"}, _g("peft")) # sorts below 0.22.0
	not gates.passes({"name": "peft", "version": "0.21.1-rc.1"}, _g("peft"))
	not gates.passes({"name": "peft", "version": "0.21.0-dev0+abc"}, _g("peft"))
}

test_hf_safetensors_accepts_any_producer if {
	gates.passes({"name": "huggingface_hub", "version": "whatever"}, _g("hf-safetensors"))
	not gates.passes({"name": 7, "version": "1.0.0"}, _g("hf-safetensors"))
}

test_unknown_adapter_has_no_gate_and_passes_nothing if {
	_g("tensorflow") == null
	not gates.passes({"name": "torch", "version": "2.13.0"}, null)
	gates.describe(null) == "no gate"
}

test_describe_names_versions_in_plain_words if {
	gates.describe(_g("dcp")) == "torch 2.13.0"
	gates.describe(_g("peft")) == "peft >=0.21.0,<0.22.0"
	gates.describe(_g("hf-safetensors")) == "*, any version"
}

test_every_mapped_format_has_a_gate if {
	every f in data.ckptgate.config.gates.formats {
		_format_gated(f)
	}
}

_format_gated(f) if f.adapter == null

_format_gated(f) if data.ckptgate.config.gates.adapters[f.adapter]
