# The model inside a training-state tree, for ckptgate.intake: a DCP checkpoint saved by a training
# loop nests the model beside optimizer, scheduler, loop and RNG state under top-level keys, under
# any names. Python measures each top-level subtree's structure (inspection.layout.tree, from
# inspect/treefacts.py); this file decides, with policy data (config/intake/data.json
# training_state), which subtree is resume state and which is the model: only the model subtree is
# written, and the rest is reported and never written. When it cannot tell, it refuses.
package ckptgate.intake

# METADATA
# description: >-
#   What consolidation writes of a training-state tree: {prefix, layout, source, excluded}, where
#   prefix is the subtree written (its names lose the prefix), layout the rule that chose it
#   ("resume_state_structure"; null for --select), source "request" (--select) or "policy", and
#   excluded the top-level keys that are not written. null when the tree is written whole.
# scope: document
default selection := null

selection := {
	"prefix": _requested,
	"layout": null,
	"source": "request",
	"excluded": _excluded(_requested),
} if {
	allow
	is_string(_requested)
} else := {
	"prefix": _model_key,
	"layout": "resume_state_structure",
	"source": "policy",
	"excluded": _excluded(_model_key),
} if {
	allow
	_requested == null
	is_string(_model_key)
}

_ts_cfg := object.get(_intake_cfg, "training_state", {"formats": []})

_requested := object.get(input, ["request", "select"], null)

_format := object.get(input, ["inspection", "format"], null)

_ts_format if _format in _ts_cfg.formats

_fqns contains t.fqn if {
	_ts_format
	some t in object.get(input, ["inspection", "layout", "tensors"], [])
}

_fqns contains name if {
	_ts_format
	some name in object.get(input, ["inspection", "layout", "bytes_items"], [])
}

_top_keys contains split(fqn, ".")[0] if some fqn in _fqns

_under(fqn, prefix) if startswith(fqn, concat("", [prefix, "."]))

_excluded(prefix) := sort({k | some k in _top_keys; k != split(prefix, ".")[0]})

# -- what each top-level subtree is, from its measured structure (never from its name) ----------
_tree := [f | _ts_format; some f in object.get(input, ["inspection", "layout", "tree"], [])]

# torch.optim.Optimizer.state_dict() (or get_optimizer_state_dict): state.<param>.<moment> beside
# param_groups, and nothing else
_optimizer(f) if {
	f.leaf == false
	f.children_count == count(f.children)
	{c | some c in f.children} == {c | some c in _ts_cfg.optimizer.children}
	f.optimizer_state_paths == true
}

# counters, schedulers and dataloader state: non-tensor leaves, or 0-dim integer tensors (a model's
# own scalars are floating point, and never alone in a subtree with no weight beside them)
_loop_state(f) if {
	f.layouts_count == 0
	f.tensors + f.bytes_items > 0
	_loop_leaves(f)
}

_loop_leaves(f) if f.bytes_items > 0

_loop_leaves(f) if {
	count(f.scalar_dtypes) > 0
	every d in f.scalar_dtypes {
		d in _ts_cfg.counter_dtypes
	}
}

# generator states (policy data's known layouts, such as torch's 5056-byte CPU state): a subtree
# whose every tensor with a dimension is one. A uint8 tensor alone says nothing (quantised weights
# are uint8 too): this counts only beside optimizer or loop state, never inside the model's subtree.
_generator_shaped(f) if {
	f.leaf == false
	f.layouts_count > 0
	f.layouts_count == count(f.layouts)
	every l in f.layouts {
		some g in _ts_cfg.generator_states
		l.dtype == g.dtype
		l.shape == g.shape
	}
}

_anchor_kind(f) := "optimizer" if _optimizer(f)

_anchor_kind(f) := "loop_state" if {
	not _optimizer(f)
	_loop_state(f)
}

_anchors[f.key] := kind if {
	some f in _tree
	kind := _anchor_kind(f)
}

_generators[f.key] := "generator_state" if {
	some f in _tree
	not _anchor_kind(f)
	_generator_shaped(f)
}

# the resume state of the tree, top-level key -> kind: optimizer and loop state, and generator
# states only beside them
default _resume := {}

_resume := object.union(_anchors, _generators) if count(_anchors) > 0

_model_candidates contains f.key if {
	some f in _tree
	not f.key in object.keys(_resume)
}

# exactly one subtree is not resume state, beside resume state: that is the model
_model_key := key if {
	count(_anchors) > 0
	count(_model_candidates) == 1
	some key in _model_candidates
	some f in _tree
	f.key == key
	f.leaf == false
}

# Resume state that holds tensors (optimizer moments, counters as tensors) would be written as
# weights; state of non-tensor leaves alone (BYTE_IO items) never is, so the rest of the tree may
# still be written whole beside it.
_tensor_resume_state if {
	some f in _tree
	_anchors[f.key]
	f.tensors > 0
}

_ambiguous if {
	count(_anchors) > 0
	not _model_key
	_tensor_resume_state
}

# generator states beside no optimizer or loop state: nothing says what the rest of the tree is
_ambiguous if {
	count(_anchors) == 0
	count(_generators) > 0
}

_kinds := object.union({f.key: "unrecognised" | some f in _tree}, _resume)

structural_deny_reasons contains reason if {
	_requested == null
	_ambiguous
	reason := _reason(
		"training_state_ambiguous",
		sprintf(
			concat("", [
				"this tree holds training resume state, but no single model subtree beside it; ",
				"its top-level keys are %v (%v); nothing is published: choose the model with --select PREFIX",
			]),
			[concat(", ", sort(_top_keys)), concat(", ", sort([sprintf("%v: %v", [k, v]) | some k, v in _kinds]))],
		),
		{"top_level_keys": sort(_top_keys), "kinds": _kinds},
	)
}

structural_deny_reasons contains reason if {
	is_string(_requested)
	not _ts_format
	reason := _reason(
		"selection_not_applicable",
		sprintf(
			"--select %v applies to training-state trees (%v); this checkpoint is %v",
			[_requested, concat(", ", _ts_cfg.formats), _format],
		),
		{"select": _requested, "format": _format},
	)
}

structural_deny_reasons contains reason if {
	is_string(_requested)
	_ts_format
	count({fqn | some fqn in _fqns; _under(fqn, _requested)}) == 0
	reason := _reason(
		"selection_matches_nothing",
		sprintf(
			"--select %v names no entry of this tree; its top-level keys are %v",
			[_requested, concat(", ", sort(_top_keys))],
		),
		{"select": _requested, "top_level_keys": sort(_top_keys)},
	)
}

info_reasons contains reason if {
	selection != null
	reason := _reason(
		"training_state_selected",
		sprintf(
			"only %v is written (its names lose the prefix); %v reported as resume state, never written",
			[selection.prefix, _keys_text(selection.excluded)],
		),
		object.union(selection, {"resume_state": _resume}),
	)
}

info_reasons contains reason if {
	allow
	_ts_format
	selection == null
	reason := _reason(
		"training_state_layout_unknown",
		sprintf(
			concat("", [
				"no training resume state (optimizer, loop or generator state) was recognised beside ",
				"the model; the tree is written whole; its top-level keys are %v",
			]),
			[concat(", ", sort(_top_keys))],
		),
		{"top_level_keys": sort(_top_keys)},
	)
}

_keys_text(keys) := "nothing else is" if count(keys) == 0

_keys_text(keys) := sprintf("%v is", [concat(", ", keys)]) if count(keys) > 0
