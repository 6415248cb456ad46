# The model inside a training-state tree, for ckptgate.intake: a DCP checkpoint saved by a training
# loop nests the model beside optimizer, scheduler and loop state under top-level keys (torchtitan's
# model/optimizer/lr_scheduler/dataloader/train_state, or get_state_dict's pair). The layouts are
# described in policy data (config/intake/data.json training_state); only the model subtree is
# written, and the rest is reported as resume state and never written.
package ckptgate.intake

# METADATA
# description: >-
#   What consolidation writes of a training-state tree: {prefix, layout, source, excluded}, where
#   prefix is the subtree written (its names lose the prefix), layout the matching layout of
#   policy data (null for --select), source "request" (--select) or "policy", and excluded the
#   top-level keys that are not written. null when the tree is written whole.
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
	"prefix": layout.model,
	"layout": layout.name,
	"source": "policy",
	"excluded": _excluded(layout.model),
} if {
	allow
	_requested == null
	layout := _ts_cfg.layouts[_matching_layout]
}

_ts_cfg := object.get(_intake_cfg, "training_state", {"formats": [], "layouts": []})

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

# the first layout (in policy data order) whose keys hold every top-level key and its model key
_matching_layout := min({i |
	some i, layout in _ts_cfg.layouts
	layout.model in _top_keys
	every k in _top_keys {
		k in layout.keys
	}
})

_excluded(prefix) := sort({k | some k in _top_keys; k != split(prefix, ".")[0]})

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
		selection,
	)
}

info_reasons contains reason if {
	allow
	_ts_format
	selection == null
	reason := _reason(
		"training_state_layout_unknown",
		sprintf(
			"the tree matches no training-state layout of policy data and is written whole; its top-level keys are %v",
			[concat(", ", sort(_top_keys))],
		),
		{"top_level_keys": sort(_top_keys)},
	)
}

_keys_text(keys) := "nothing else is" if count(keys) == 0

_keys_text(keys) := sprintf("%v is", [concat(", ", keys)]) if count(keys) > 0
