# Tests of ckptgate.intake's selection (selection.rego): the model subtree of a training-state
# tree, recognised from the measured structure of its top-level subtrees, --select, the refusal
# of an ambiguous tree and the info reason for a tree written whole.
# Helpers such as _decide and _codes are in intake_test.rego.
package ckptgate.intake_test

import data.ckptgate.testdata_test as td

_tree_input(fqns, bytes_items, select) := json.patch(td.pure_data_input, array.concat(
	[
		{"op": "replace", "path": "/inspection/format", "value": "dcp-torch-save"},
		{"op": "replace", "path": "/inspection/layout", "value": {
			"tensors": [{"fqn": f} | some f in fqns],
			"bytes_items": bytes_items,
		}},
	],
	_select_patch(select),
))

_select_patch(null) := []

_select_patch(select) := [{"op": "add", "path": "/request/select", "value": select}] if select != null

# Measured facts of one top-level subtree (inspect/treefacts.py), by what it holds.
_facts(key, over) := object.union(
	{
		"key": key, "leaf": false, "tensors": 1, "bytes_items": 0, "children": ["weight"],
		"children_count": 1, "optimizer_state_paths": false, "layouts_count": 1, "scalar_dtypes": [],
		"layouts": [{"dtype": "float32", "shape": [8, 4], "count": 1}],
	},
	over,
)

_weights(key) := _facts(key, {})

_optim(key) := _facts(key, {
	"tensors": 4, "bytes_items": 6, "children": ["param_groups", "state"], "children_count": 2,
	"optimizer_state_paths": true, "scalar_dtypes": ["float32"],
})

_counters(key) := _facts(key, {
	"tensors": 2, "children": ["ntokens_seen", "step"], "children_count": 2,
	"layouts": [], "layouts_count": 0, "scalar_dtypes": ["int64"],
})

_loop(key) := _facts(key, {
	"tensors": 0, "bytes_items": 5, "children": ["base_lrs", "last_epoch"], "children_count": 2,
	"layouts": [], "layouts_count": 0,
})

_rng(key) := _facts(key, {
	"tensors": 2, "bytes_items": 1, "children": ["cpu", "cuda", "python"], "children_count": 3, "layouts_count": 2,
	"layouts": [{"dtype": "uint8", "shape": [5056], "count": 1}, {"dtype": "uint8", "shape": [16], "count": 1}],
})

_facts_input(tree, select) := json.patch(td.pure_data_input, array.concat(
	[
		{"op": "replace", "path": "/inspection/format", "value": "dcp-torch-save"},
		{"op": "replace", "path": "/inspection/layout", "value": {
			"tensors": [{"fqn": concat(".", [f.key, "w"])} | some f in tree],
			"bytes_items": [],
			"tree": tree,
		}},
	],
	_select_patch(select),
))

_titan := [_weights("model"), _optim("optimizer"), _loop("lr_scheduler"), _counters("train_state"), _rng("extra")]

test_a_torchtitan_tree_selects_its_model_subtree if {
	d := _decide(_facts_input(_titan, null))
	d.allow == true
	d.selection == {
		"prefix": "model", "layout": "resume_state_structure", "source": "policy",
		"excluded": ["extra", "lr_scheduler", "optimizer", "train_state"],
	}
	not "training_state_layout_unknown" in _codes(d)
	some r in d.reasons
	r.code == "training_state_selected"
	r.evidence.resume_state == {
		"extra": "generator_state", "lr_scheduler": "loop_state",
		"optimizer": "optimizer", "train_state": "loop_state",
	}
}

# the same structure under other names is recognised the same way
test_resume_state_is_recognised_by_structure_not_by_name if {
	d := _decide(_facts_input([_weights("net"), _optim("opt"), _counters("progress"), _rng("rng")], null))
	d.allow == true
	d.selection.prefix == "net"
	d.selection.excluded == ["opt", "progress", "rng"]
	d2 := _decide(_facts_input([_optim("model"), _weights("weights")], null)) # names that mislead
	d2.selection.prefix == "weights"
}

test_only_resume_state_is_refused_as_ambiguous if {
	d := _decide(_facts_input([_optim("opt"), _rng("rng"), _counters("step")], null))
	d.allow == false
	d.refusal == "input"
	d.selection == null
	some r in d.reasons
	r.code == "training_state_ambiguous"
	r.evidence.top_level_keys == ["opt", "rng", "step"]
	contains(r.message, "--select")
}

test_two_model_candidates_beside_resume_state_are_refused if {
	d := _decide(_facts_input([_weights("model"), _weights("ema"), _optim("optimizer")], null))
	d.allow == false
	"training_state_ambiguous" in _codes(d)
	some r in d.reasons
	r.code == "training_state_ambiguous"
	r.evidence.kinds == {"ema": "unrecognised", "model": "unrecognised", "optimizer": "optimizer"}
}

test_a_generator_state_beside_no_optimizer_or_loop_state_is_refused if {
	d := _decide(_facts_input([_weights("model"), _rng("rng")], null))
	d.allow == false
	"training_state_ambiguous" in _codes(d)
}

# a uint8 tensor of a generator's size inside the model's subtree is the model's (quantised weights)
test_generator_shaped_weights_inside_the_model_stay_the_model if {
	model := _facts("model", {
		"tensors": 2, "layouts_count": 2,
		"layouts": [{"dtype": "uint8", "shape": [5056], "count": 1}, {"dtype": "float32", "shape": [8], "count": 1}],
	})
	d := _decide(_facts_input([model, _optim("optimizer")], null))
	d.selection.prefix == "model"

	# a subtree that holds nothing but a generator-shaped tensor, beside an optimizer, cannot be told
	# from generator state: with no other model subtree the tree is refused, never guessed
	quantised := _facts("q", {"layouts": [{"dtype": "uint8", "shape": [5056], "count": 1}]})
	d2 := _decide(_facts_input([quantised, _optim("optimizer")], null))
	"training_state_ambiguous" in _codes(d2)
}

test_not_quite_an_optimizer_or_loop_state_is_not_resume_state if {
	extra_child := object.union(_optim("opt"), {"children": ["param_groups", "state", "w"], "children_count": 3})
	d := _decide(_facts_input([_weights("model"), extra_child], null))
	d.selection == null
	"training_state_layout_unknown" in _codes(d)
	flat_state := object.union(_optim("opt"), {"optimizer_state_paths": false})
	d2 := _decide(_facts_input([_weights("model"), flat_state], null))
	d2.selection == null
	float_scalar := object.union(_counters("temperature"), {"scalar_dtypes": ["float32"]})
	d3 := _decide(_facts_input([_weights("model"), float_scalar], null))
	d3.selection == null
}

test_select_overrides_an_ambiguous_tree if {
	d := _decide(_facts_input([_weights("model"), _weights("ema"), _optim("optimizer")], "ema"))
	d.allow == true
	d.selection == {"prefix": "ema", "layout": null, "source": "request", "excluded": ["model", "optimizer"]}
}

test_an_unknown_tree_is_written_whole_with_its_top_level_keys_named if {
	d := _decide(_tree_input(["model.w", "ema.w"], [], null))
	d.allow == true
	d.selection == null
	some r in d.reasons
	r.code == "training_state_layout_unknown"
	r.evidence.top_level_keys == ["ema", "model"]
}

test_select_overrides_the_layout if {
	fqns := ["model.w", "model.b", "optimizer.state.w.exp_avg", "train_state.step"]
	d := _decide(_tree_input(fqns, [], "optimizer.state"))
	d.selection == {
		"prefix": "optimizer.state", "layout": null, "source": "request",
		"excluded": ["model", "train_state"],
	}
}

test_select_that_names_nothing_is_denied if {
	d := _decide(_facts_input(_titan, "modelx"))
	d.allow == false
	d.selection == null
	"selection_matches_nothing" in _codes(d)
}

test_select_on_a_format_without_nested_keys_is_denied if {
	inp := json.patch(td.pure_data_input, [{"op": "add", "path": "/request/select", "value": "model"}])
	d := _decide(inp)
	d.allow == false
	"selection_not_applicable" in _codes(d)
}

test_a_plain_safetensors_checkpoint_has_no_selection_and_no_warning if {
	d := _decide(td.pure_data_input)
	d.selection == null
	not "training_state_layout_unknown" in _codes(d)
}

# model weights at the top level beside non-tensor loop state alone (BYTE_IO counters, which are
# never written as weights): the tree's tensors are written whole, nothing is refused
test_top_level_weights_beside_non_tensor_loop_state_are_written_whole if {
	d := _decide(_facts_input([_weights("embed"), _weights("head"), _loop("train_state")], null))
	d.allow == true
	d.selection == null
}

# the same with counters held as tensors: they would be written as weights, so it is refused
test_top_level_weights_beside_tensor_counters_are_refused if {
	d := _decide(_facts_input([_weights("embed"), _weights("head"), _counters("train_state")], null))
	d.allow == false
	"training_state_ambiguous" in _codes(d)
}
