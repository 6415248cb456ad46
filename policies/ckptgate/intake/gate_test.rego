# Tests of the producer-release gate in every plane (attestations.rego, gates.rego): a
# version-volatile adapter passes only a release (and topology) that a qualified row names,
# whatever the plane; a version-independent adapter passes any; a statement that names no
# release cannot vouch for a version-volatile adapter alone. Helpers are in intake_test.rego.
package ckptgate.intake_test

import data.ckptgate.intake
import data.ckptgate.testdata_test as td

_torch(version) := {"name": "torch", "version": version}

# A DCP checkpoint (torch.save storage) read by the static pickle reader, with a trusted
# provenance statement naming a torch release: the plane in which DCP took anything before.
_dcp_static(release) := td.patched([
	{"op": "replace", "path": "/inspection/format", "value": "dcp-torch-save"},
	{"op": "replace", "path": "/inspection/loaders", "value": ["static_pickle"]},
	{"op": "add", "path": "/inspection/pickles", "value": {".metadata": _pickle}},
	{"op": "replace", "path": "/containment", "value": null},
	{"op": "replace", "path": "/attestations/0/statement/predicateType", "value": td.provenance},
	{"op": "replace", "path": "/attestations/0/statement/predicate/producer", "value": release},
])

_reason_of(d, code) := r if {
	some r in d.reasons
	r.code == code
}

test_a_dcp_checkpoint_from_an_unqualified_torch_is_refused_in_the_static_plane if {
	d := _decide(_dcp_static(_torch("2.15.0")))
	d.allow == false
	d.plane == "static_pickle"
	d.refusal == "policy"
	r := _reason_of(d, "producer_release_unqualified")
	r.message == concat("", [
		"torch 2.15.0 is not a qualified release for adapter dcp reading dcp-torch-save ",
		"(attestation attestations/sha256-aaaa.intoto.json); ",
		"qualified: 2.13.0 (tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=2)",
	])
	r.evidence.nearest_qualified == ["2.13.0 (tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=2)"]
}

test_a_dcp_checkpoint_from_a_qualified_torch_is_admitted_in_the_static_plane if {
	d := _decide(_dcp_static(_torch("2.13.0")))
	d.allow == true
	d.plane == "static_pickle"
}

test_a_dcp_checkpoint_is_gated_per_format if {
	hf_only := [td.qualified.adapters.dcp.rows[1]]
	no_hf_rows := json.patch(td.qualified, [{"op": "replace", "path": "/adapters/dcp/rows", "value": hf_only}])
	d := intake.decision with input as _dcp_static(_torch("2.13.0"))
		with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.qualified as no_hf_rows
	d.allow == false
	r := _reason_of(d, "producer_release_unqualified")
	endswith(r.message, "qualified: none")
}

test_a_megatron_checkpoint_at_an_unqualified_topology_is_refused_naming_the_qualified_one if {
	inp := td.patched([
		{"op": "replace", "path": "/inspection/format", "value": "megatron-torch-dist"},
		{"op": "replace", "path": "/inspection/loaders", "value": ["static_pickle"]},
		{"op": "add", "path": "/inspection/pickles", "value": {".metadata": _pickle}},
		{"op": "replace", "path": "/containment", "value": null},
		{"op": "replace", "path": "/attestations/0/statement/predicateType", "value": td.provenance},
		{
			"op": "replace", "path": "/attestations/0/statement/predicate/producer",
			"value": {"name": "megatron-core", "version": "0.16.1"},
		},
		{
			"op": "replace", "path": "/attestations/0/statement/predicate/topology",
			"value": {"tp": 2, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 4},
		},
	])
	d := _decide(inp)
	d.allow == false
	r := _reason_of(d, "topology_unqualified")
	contains(r.message, "not at the attested topology tp=2 pp=2 dp=1 cp=1 ep=1 etp=1 world_size=4")
	r.evidence.nearest_qualified == ["0.16.1 (tp=2 pp=1 dp=1 cp=1 ep=1 etp=1 world_size=2)"]
	ok := json.patch(inp, [{"op": "replace", "path": "/attestations/0/statement/predicate/topology/pp", "value": 1}])
	not _decide(ok).allow # world_size 4 is still not qualified
	ok2 := json.patch(ok, [{
		"op": "replace", "path": "/attestations/0/statement/predicate/topology/world_size",
		"value": 2,
	}])
	_decide(ok2).allow
}

test_a_framework_checkpoint_from_an_unqualified_release_names_the_nearest if {
	d := _decide(td.with_value("/attestations/0/statement/predicate/producer/version", "0.18.9"))
	d.allow == false
	d.refusal == "policy"
	r := _reason_of(d, "producer_release_unqualified")
	endswith(r.message, "qualified: 0.19.8 (tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=2)")
}

test_a_version_independent_adapter_is_admitted_with_any_release if {
	every version in ["0.0.1", "99.0.0", "not-a-version"] {
		d := _decide(td.patched([
			{"op": "replace", "path": "/inspection/format", "value": "hf-sharded-safetensors"},
			{"op": "replace", "path": "/inspection/loaders", "value": ["json", "safetensors"]},
			{"op": "replace", "path": "/attestations/0/statement/predicateType", "value": td.provenance},
			{
				"op": "replace", "path": "/attestations/0/statement/predicate/producer",
				"value": {"name": "huggingface_hub", "version": version},
			},
			{"op": "replace", "path": "/containment", "value": null},
		]))
		d.allow == true
	}
}

_slsa_for_dcp(predicate) := td.patched([
	{"op": "replace", "path": "/inspection/format", "value": "dcp-torch-save"},
	{"op": "replace", "path": "/inspection/loaders", "value": ["static_pickle"]},
	{"op": "add", "path": "/inspection/pickles", "value": {".metadata": _pickle}},
	{"op": "replace", "path": "/containment", "value": null},
	{"op": "replace", "path": "/attestations", "value": [_slsa_with(predicate)]},
])

_slsa_with(predicate) := json.patch(_slsa_attestation, [{
	"op": "replace", "path": "/statement/predicate",
	"value": predicate,
}])

_slsa_dcp_decide(inp) := d if {
	d := intake.decision with input as inp with data.ckptgate.config.trust as _slsa_trust
		with data.ckptgate.config.qualified as td.qualified
}

test_a_statement_without_a_release_cannot_vouch_for_a_version_volatile_adapter if {
	d := _slsa_dcp_decide(_slsa_for_dcp(_slsa_attestation.statement.predicate))
	d.allow == false
	r := _reason_of(d, "producer_release_missing")
	contains(r.message, "names no torch release")
	r.evidence.qualified == ["2.13.0 (tp=1 pp=1 dp=2 cp=1 ep=1 etp=1 world_size=2)"]
	not _reason_of(d, "producer_release_unqualified")
}

_slsa_deps(uris) := object.union(_slsa_attestation.statement.predicate, {"buildDefinition": {
	"buildType": "https://example.com/trainer/v1", "externalParameters": {},
	"resolvedDependencies": [{"uri": uri} | some uri in uris],
}})

test_slsa_provenance_vouches_through_the_torch_release_among_its_dependencies if {
	_slsa_dcp_decide(_slsa_for_dcp(_slsa_deps(["pkg:pypi/numpy@2.1.0", "pkg:pypi/torch@2.13.0"]))).allow
	_slsa_dcp_decide(_slsa_for_dcp(_slsa_deps(["pkg:pypi/Torch@2.13.0+cu128"]))).allow # normalised name, build metadata
	unqualified := _slsa_dcp_decide(_slsa_for_dcp(_slsa_deps(["pkg:pypi/torch@2.15.0"])))
	_reason_of(unqualified, "producer_release_unqualified")
	ambiguous := _slsa_dcp_decide(_slsa_for_dcp(_slsa_deps(["pkg:pypi/torch@2.13.0", "pkg:pypi/torch@2.15.0"])))
	_reason_of(ambiguous, "producer_release_missing")
}

test_qualify_is_not_gated_so_a_new_release_can_be_qualified if {
	inp := json.patch(_dcp_static(_torch("2.15.0")), [{"op": "replace", "path": "/request/action", "value": "qualify"}])
	d := _decide(inp)
	d.allow == true
}

test_an_overlay_restriction_narrows_the_static_plane_too if {
	d := intake.decision with input as _dcp_static(_torch("2.13.0"))
		with data.ckptgate.config.trust as td.trust
		with data.ckptgate.config.qualified as td.qualified
		with data.ckptgate.config.gates.adapters.dcp.versions as {"any": false, "exact": ["2.12.0"], "ranges": []}
	d.allow == false
	r := _reason_of(d, "producer_release_unqualified")
	endswith(r.message, "qualified: none")
}
