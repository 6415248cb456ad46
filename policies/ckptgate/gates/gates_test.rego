# METADATA
# title: ckptgate.gates_test
# description: >-
#   Tests for the producer-release gates: hand-written facts (config.gates) with generated
#   qualified rows (config.qualified). The rows are given here, so the tests do not depend on
#   which qualifications happen to be committed.
package ckptgate.gates_test

import data.ckptgate.gates

_topo(tp, dp, ws) := {"tp": tp, "pp": 1, "dp": dp, "cp": 1, "ep": 1, "etp": 1, "world_size": ws}

_row(fmt, producer, version, topology) := {
	"format": fmt, "producer": producer, "producer_version": version, "topology": topology,
	"fixture_digest": "sha256:aa", "attestation": "a", "evidence": "e",
}

_qualified := {"adapters": {
	"dcp": {"producer": "torch", "rows": [
		_row("dcp-torch-save", "torch", "2.13.0", _topo(1, 2, 2)),
		_row("dcp-torch-save", "torch", "2.11.0", _topo(1, 2, 2)),
		_row("dcp-hf-safetensors", "torch", "2.13.0", _topo(1, 2, 2)),
	]},
	"megatron-torch-dist": {"producer": "megatron-core", "rows": [
		_row("megatron-torch-dist", "megatron-core", "0.16.1", _topo(2, 1, 2)),
		_row("megatron-torch-dist", "megatron-core", "0.16.1", _topo(2, 2, 4)),
	]},
	"hf-safetensors": {"producer": "*", "rows": [_hf_row]},
}}

_hf_row := _row("safetensors", "transformers", "5.24.0", _topo(1, 1, 1))

_config := {"gates": data.ckptgate.config.gates, "qualified": _qualified}

_g(adapter) := gates.gate(adapter, _config)

_torch(v) := {"name": "torch", "version": v}

test_dcp_passes_exactly_the_qualified_torch_releases_of_the_format if {
	gates.passes(_torch("2.13.0"), _g("dcp"), "dcp-torch-save", null)
	gates.passes(_torch("2.13.0+cpu"), _g("dcp"), "dcp-torch-save", null) # build metadata is ignored
	gates.passes(_torch("2.11.0"), _g("dcp"), "dcp-torch-save", null)
	not gates.passes(_torch("2.11.0"), _g("dcp"), "dcp-hf-safetensors", null) # qualified for the other format only
	not gates.passes(_torch("2.15.0"), _g("dcp"), "dcp-torch-save", null)
	not gates.passes(_torch("2.12.1"), _g("dcp"), "dcp-torch-save", null)
	not gates.passes(_torch("2.13.0a0+git1234"), _g("dcp"), "dcp-torch-save", null)
	not gates.passes({"name": "deepspeed", "version": "2.13.0"}, _g("dcp"), "dcp-torch-save", null)
	not gates.passes(null, _g("dcp"), "dcp-torch-save", null) # a statement naming no release
}

test_a_version_volatile_adapter_without_qualified_rows_passes_nothing if {
	gates.applies(_g("deepspeed-zero"))
	not gates.passes({"name": "deepspeed", "version": "0.19.8"}, _g("deepspeed-zero"), "deepspeed-zero2", null)
}

test_the_attested_topology_must_be_a_qualified_rows if {
	release := {"name": "megatron-core", "version": "0.16.1"}
	g := _g("megatron-torch-dist")
	gates.passes(release, g, "megatron-torch-dist", _topo(2, 1, 2))
	gates.passes(release, g, "megatron-torch-dist", _topo(2, 2, 4))
	gates.passes(release, g, "megatron-torch-dist", {"tp": 2}) # only the axes it names are compared
	gates.passes(release, g, "megatron-torch-dist", null) # names none: not compared
	not gates.passes(release, g, "megatron-torch-dist", _topo(4, 1, 4))
	not gates.passes(release, g, "megatron-torch-dist", {"tp": 2, "ep": 2})
	gates.nearest_topologies(release, g, "megatron-torch-dist", _topo(4, 1, 4)) == [
		"0.16.1 (tp=2 pp=1 dp=1 cp=1 ep=1 etp=1 world_size=2)",
		"0.16.1 (tp=2 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=4)",
	]
	wide := "0.16.1 (tp=2 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=4)"
	gates.nearest_topologies(release, g, "megatron-torch-dist", {"tp": 2, "dp": 2, "ep": 2}) == [wide]
}

test_nearest_versions_are_the_neighbours_below_and_above if {
	gates.nearest_versions(_g("dcp"), "dcp-torch-save", "2.15.0") == ["2.13.0"]
	gates.nearest_versions(_g("dcp"), "dcp-torch-save", "2.12.0") == ["2.11.0", "2.13.0"]
	gates.nearest_versions(_g("dcp"), "dcp-torch-save", "2.10.0") == ["2.11.0"]
	gates.nearest_versions(_g("dcp"), "dcp-torch-save", "not-semver") == ["2.11.0", "2.13.0"]
	gates.nearest_versions(_g("dcp"), "dcp-hf-safetensors", null) == ["2.13.0"]
	gates.nearest_rows(_g("dcp"), "dcp-torch-save", "2.15.0") == ["2.13.0 (tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=2)"]
	gates.nearest_versions(_g("deepspeed-zero"), "deepspeed-zero2", "0.18.9") == []
}

test_an_overlay_restriction_only_narrows if {
	narrowed := gates.gate("dcp", json.patch(_config, [{
		"op": "add", "path": "/gates/adapters/dcp/versions",
		"value": {"any": false, "exact": ["2.11.0", "2.15.0"], "ranges": []},
	}]))
	gates.passes(_torch("2.11.0"), narrowed, "dcp-torch-save", null)
	not gates.passes(_torch("2.13.0"), narrowed, "dcp-torch-save", null) # qualified, but left out
	not gates.passes(_torch("2.15.0"), narrowed, "dcp-torch-save", null) # named, but never qualified
}

test_a_range_restriction_admits_releases_only if {
	spec := {"any": false, "exact": [], "ranges": [{"min": "0.21.0", "max_exclusive": "0.22.0"}]}
	gates.version_allowed("0.21.2+local", spec) # build metadata is ignored
	not gates.version_allowed("0.22.0-rc1", spec) # sorts below 0.22.0
	not gates.version_allowed("0.21.1-rc.1", spec)
	not gates.version_allowed("0.21.0-dev0+abc", spec)
	not gates.version_allowed("0.22.0", spec)
}

test_a_version_independent_adapter_passes_any_release_and_the_gate_does_not_apply if {
	g := _g("hf-safetensors")
	gates.version_independent(g)
	not gates.applies(g)
	gates.passes({"name": "huggingface_hub", "version": "whatever"}, g, "safetensors", {"tp": 8})
	not gates.passes({"name": 7, "version": "1.0.0"}, g, "safetensors", null)
}

test_a_restricted_version_independent_adapter_is_gated if {
	g := gates.gate("hf-safetensors", json.patch(_config, [{
		"op": "add", "path": "/gates/adapters/hf-safetensors/versions",
		"value": {"any": false, "exact": ["2.4.0"], "ranges": []},
	}]))
	gates.applies(g)
	gates.passes({"name": "huggingface_hub", "version": "2.4.0"}, g, "safetensors", null)
	not gates.passes({"name": "huggingface_hub", "version": "2.5.0"}, g, "safetensors", null)
}

test_only_pure_safetensors_is_version_independent_in_the_bundled_data if {
	independent := {name | some name, a in data.ckptgate.config.gates.adapters; gates.version_independent(a)}
	independent == {"hf-safetensors"}
}

test_unknown_adapter_has_no_gate_and_passes_nothing if {
	_g("tensorflow") == null
	not gates.applies(null)
	not gates.passes(_torch("2.13.0"), null, "dcp-torch-save", null)
	gates.describe(null) == "no gate"
}

test_describe_names_versions_in_plain_words if {
	gates.describe(_g("dcp")) == "torch 2.11.0 or 2.13.0"
	gates.describe(_g("deepspeed-zero")) == "deepspeed (no qualified release)"
	startswith(gates.describe(_g("hf-safetensors")), "*, any version (pure data")
}

test_every_mapped_format_has_a_gate if {
	every f in data.ckptgate.config.gates.formats {
		_format_gated(f)
	}
}

_format_gated(f) if f.adapter == null

_format_gated(f) if data.ckptgate.config.gates.adapters[f.adapter]
