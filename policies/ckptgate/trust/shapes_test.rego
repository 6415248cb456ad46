# Tests of the predicate shapes (shapes.rego): which shape a predicate type has, where its
# producer is named, and how many unbound subjects a file-by-file statement may carry.
package ckptgate.trust_test

import data.ckptgate.trust

_predicates := data.ckptgate.config.intake.predicates

_cfg := {"intake": data.ckptgate.config.intake}

_att(type, predicate, verification) := {
	"statement": {"predicateType": type, "predicate": predicate},
	"verification": verification,
}

test_each_predicate_kind_has_its_shape if {
	trust.shape(_att(_predicates.qualification.type, {}, {}), _predicates) == "ckptgate"
	trust.shape(_att(_predicates.model_signing.type, {}, {}), _predicates) == "model_signing"
	trust.shape(_att(_predicates.slsa_provenance.type, {}, {}), _predicates) == "in_toto"
	trust.shape(_att("https://example.com/unknown/v1", {}, {}), _predicates) == "ckptgate"
}

test_the_producer_is_read_where_the_kind_names_it if {
	builder := "https://example.com/builder@v1"
	slsa := _att(_predicates.slsa_provenance.type, {"runDetails": {"builder": {"id": builder}}}, {})
	trust.producer(slsa, _predicates) == builder
	qual := _att(_predicates.qualification.type, {"producer": {"name": "deepspeed"}}, {})
	trust.producer(qual, _predicates) == "deepspeed"
	trust.producer(_att(_predicates.slsa_provenance.type, {"producer": {"name": "x"}}, {}), _predicates) == null
}

test_unbound_subjects_count_against_the_kinds_limit if {
	limit := _predicates.slsa_provenance.max_extra_subjects
	within := _att(_predicates.slsa_provenance.type, {}, {"binding": "manifest", "manifest": {"extra_subjects": limit}})
	not trust.extra_subjects_over(within, _cfg)
	over := _att(
		_predicates.slsa_provenance.type, {},
		{"binding": "manifest", "manifest": {"extra_subjects": limit + 1}},
	)
	trust.extra_subjects_over(over, _cfg)
	no_limit := _att(_predicates.model_signing.type, {}, {"binding": "manifest", "manifest": {"extra_subjects": 9}})
	not trust.extra_subjects_over(no_limit, _cfg)
}
