# Tests of ckptgate.intake's selection (selection.rego): the model subtree of a training-state
# tree whose layout policy data describes, --select, and the warning for an unknown tree.
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

_titan := ["model.w", "model.b", "optimizer.state.w.exp_avg", "train_state.step"]

test_a_torchtitan_tree_selects_its_model_subtree if {
	d := _decide(_tree_input(_titan, ["lr_scheduler.last_epoch"], null))
	d.allow == true
	d.selection == {
		"prefix": "model", "layout": "torchtitan", "source": "policy",
		"excluded": ["lr_scheduler", "optimizer", "train_state"],
	}
	"training_state_selected" in _codes(d)
	not "training_state_layout_unknown" in _codes(d)
}

test_get_state_dict_pair_matches_the_first_layout_that_holds_its_keys if {
	d := _decide(_tree_input(["model.w", "optim.state.w.step"], [], null))
	d.selection.layout == "get_state_dict_optim"
	d2 := _decide(_tree_input(["model.w", "optimizer.state.w.step"], [], null))
	d2.selection.layout == "get_state_dict" # the first layout in policy data that holds both keys
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
	d := _decide(_tree_input(_titan, [], "optimizer.state"))
	d.selection == {
		"prefix": "optimizer.state", "layout": null, "source": "request",
		"excluded": ["model", "train_state"],
	}
}

test_select_that_names_nothing_is_denied if {
	d := _decide(_tree_input(_titan, [], "modelx"))
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
