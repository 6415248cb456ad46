# What the Megatron -> Hugging Face mapping takes from the declared config alone, for
# ckptgate.intake. Python compares a Megatron-LM save's args with the config through the declared
# table (consolidate/hf/args.json) and refuses a contradiction before the decision; it reports
# input.hf_mapping.megatron_args (present or absent) and input.hf_mapping.declared_not_measured,
# what neither the tensors nor the args record. The decision says so in words, as info reasons
# (hf_mapping_declared_not_measured is hfmapping.rego's): they never change allow.
package ckptgate.intake

# METADATA
# description: The Megatron-LM arguments that agreed with the config, named in the decision.
info_reasons contains reason if {
	is_string(input.hf_mapping.family)
	agreed := object.get(input.hf_mapping, ["megatron_args", "agreed"], [])
	count(agreed) > 0
	reason := _reason(
		"hf_mapping_args_agreed",
		sprintf(
			"%v of the checkpoint's Megatron-LM arguments agree with the declared config (consolidate/hf/args.json)",
			[count(agreed)],
		),
		{"args": sort([a.arg | some a in agreed])},
	)
}
