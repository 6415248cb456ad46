# Predicate shapes for ckptgate.trust, per predicate kind of the intake data
# (data.ckptgate.config.intake.predicates): its shape, where its predicate names the producer
# that trust data's producers scope matches, and how many subjects of a statement bound file by
# file may name no file of the checkpoint.
package ckptgate.trust

# METADATA
# scope: document
# description: >-
#   The shape of att's predicate kind in intake data (predicates[kind].shape): ckptgate (its own
#   predicates, and any type no kind names), model_signing or in_toto.
default shape(_, _) := "ckptgate"

shape(att, predicates) := s if {
	shapes := {object.get(predicates[kind], "shape", "ckptgate") |
		some kind in kinds(att, predicates)
	}
	count(shapes) == 1
	some s in shapes
}

# METADATA
# scope: document
# description: >-
#   The predicate kinds of intake data that att is of: those naming its predicate type and, for
#   a kind with build_type, its predicate's buildDefinition.buildType. A kind naming a build type
#   takes its statements from the kind of the same type without one (training provenance is SLSA
#   provenance, and only of the training kind).
kinds(att, predicates) := {kind |
	some kind, p in predicates
	p.type == at(att, ["statement", "predicateType"])
	_build_type_matches(att, p, predicates)
}

_build_type_of(att) := at(at(att, ["statement", "predicate"]), ["buildDefinition", "buildType"])

_build_type_matches(att, p, _) if p.build_type == _build_type_of(att)

_build_type_matches(att, p, predicates) if {
	not p.build_type
	not _claimed_build_type(att, p.type, predicates)
}

_claimed_build_type(att, predicate_type, predicates) if {
	some q in predicates
	q.type == predicate_type
	q.build_type == _build_type_of(att)
}

default _producer_path(_, _) := ["producer", "name"]

_producer_path(att, predicates) := path if {
	paths := {p |
		some kind in kinds(att, predicates)
		p := predicates[kind].producer_path
	}
	count(paths) == 1
	some path in paths
}

# METADATA
# scope: document
# description: >-
#   Who produced att, as trust data's producers scope matches it: the predicate field at the
#   kind's producer_path (for SLSA provenance, runDetails.builder.id), else producer.name.
producer(att, predicates) := at(at(att, ["statement", "predicate"]), _producer_path(att, predicates))

_manifest_bound(att) if at(att, ["verification", "binding"]) == "manifest"

# METADATA
# scope: document
# description: >-
#   True when Python bound att's subjects file by file (verification.manifest) and more of them
#   name no measured file than its predicate kind's max_extra_subjects allows. A signed file that
#   was removed from the checkpoint is such a subject. A kind without max_extra_subjects allows any.
default extra_subjects_over(_, _) := false

extra_subjects_over(att, cfg) if {
	extra := at(att, ["verification", "manifest", "extra_subjects"])
	some kind in kinds(att, cfg.intake.predicates)
	limit := cfg.intake.predicates[kind].max_extra_subjects
	is_number(limit)
	not extra <= limit
}

_extra_limit(att, cfg) := [limit |
	some kind in kinds(att, cfg.intake.predicates)
	limit := object.get(cfg.intake.predicates[kind], "max_extra_subjects", null)
]
