# METADATA
# title: ckptgate.gates
# description: >-
#   Producer-version gates per adapter (data.ckptgate.config.gates). A gate names the producer
#   and the versions an adapter was qualified on: any version, an exact list, or half-open
#   ranges [min, max_exclusive). Versions compare as semantic versions, so build metadata such
#   as "+cpu" is ignored; a version that is not valid semver never passes an exact or range
#   gate, and a pre-release (0.22.0-rc1) never passes a range. DCP documents no general
#   saved-state backward-compatibility guarantee, so its adapter is gated to the torch versions
#   it was qualified on [R01].
package ckptgate.gates

# METADATA
# scope: document
# description: The gate for an adapter, or null when the adapter has none.
default gate(_, _) := null

gate(adapter, gates) := gates.adapters[adapter]

# METADATA
# scope: document
# description: True when producer (an object with name and version) passes the adapter gate g.
default passes(_, _) := false

passes(producer, g) if {
	_producer_matches(producer.name, g.producer)
	version_allowed(producer.version, g.versions)
}

_producer_matches(name, "*") if is_string(name)

_producer_matches(name, expected) if name == expected

# METADATA
# scope: document
# description: True when version satisfies the version spec {any, exact, ranges}.
default version_allowed(_, _) := false

version_allowed(version, spec) if {
	spec.any == true
	is_string(version)
}

version_allowed(version, spec) if {
	semver.is_valid(version)
	some exact in spec.exact
	semver.is_valid(exact)
	semver.compare(version, exact) == 0
}

version_allowed(version, spec) if {
	semver.is_valid(version)
	not _prerelease(version)
	some range in spec.ranges
	semver.is_valid(range.min)
	semver.is_valid(range.max_exclusive)
	semver.compare(version, range.min) >= 0
	semver.compare(version, range.max_exclusive) < 0
}

# METADATA
# scope: document
# description: A plain-words summary of a version spec, for messages.
describe(null) := "no gate"

describe(g) := sprintf("%s, any version", [g.producer]) if g.versions.any == true

describe(g) := sprintf("%s %s", [g.producer, concat(" or ", _spans(g.versions))]) if {
	g != null
	g.versions.any != true
}

_spans(spec) := array.concat(
	[e | some e in spec.exact],
	[sprintf(">=%s,<%s", [r.min, r.max_exclusive]) | some r in spec.ranges],
)

# A pre-release sorts below its release, so 0.22.0-rc1 lies inside [0.21.0, 0.22.0): it is not a
# release of the range, and a range admits releases only.
_prerelease(version) if regex.match(`^[0-9]+\.[0-9]+\.[0-9]+-`, version)
