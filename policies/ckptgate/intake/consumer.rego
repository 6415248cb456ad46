# A consumer repository's own deny rules, for ckptgate.intake. The extra Rego that a repository's
# configuration names (extra_rego) lives under data.ckptgate_consumer, and ckptgate refuses it,
# from OPA's own parse, when it declares a package or a rule anywhere else. The decision reads one
# rule there, the set data.ckptgate_consumer.deny of {code, message} objects (an evidence object
# may come with them). Each element is a deny reason "consumer.<code>" of refusal class policy.
# An element of another shape, or a deny that is not a set, is a deny too (consumer.malformed),
# never ignored. Nothing here can allow: consumer Rego only adds reasons to deny_reasons. It is
# read by the decision only, not by the precheck, which sees no fixture or attestation.
package ckptgate.intake

deny_reasons contains reason if {
	some reason in _consumer_reasons(_consumer_deny)
}

# Defined only when the consumer defines data.ckptgate_consumer.deny (of any type).
_consumer_deny := data.ckptgate_consumer.deny

# "consumer." and the code stay within the 64 characters of a reason code.
_consumer_code := `^[a-z][a-z0-9_.-]{0,54}$`

# The value is read only inside functions, whose arguments the type checker takes as any: a
# consumer's deny of another type is then a deny reason here, not a bundle that fails to compile.
_consumer_reasons(value) := {_consumer_reason(element) | some element in value} if {
	is_set(value)
} else := {_consumer_malformed(
	sprintf("data.ckptgate_consumer.deny is a %v, not a set of {code, message}", [type_name(value)]),
	value,
)}

_consumer_reason(element) := _reason(
	concat(".", ["consumer", element.code]),
	element.message,
	object.get(element, "evidence", {}),
) if {
	is_object(element)
	count(object.keys(element) - {"code", "message", "evidence"}) == 0
	is_string(element.code)
	regex.match(_consumer_code, element.code)
	is_string(element.message)
	is_object(object.get(element, "evidence", {}))
} else := _consumer_malformed(
	"an element of data.ckptgate_consumer.deny is not {code, message} with a lower-case code",
	element,
)

_consumer_malformed(message, value) := _reason(
	"consumer.malformed",
	message,
	{"rule": "data.ckptgate_consumer.deny", "value": substring(sprintf("%v", [value]), 0, 300)},
)
