# METADATA
# title: Administrative authorization for the embedded OPA server
# description: >-
#   The embedded server runs with --authentication=token --authorization=basic. A request is
#   admitted only when the sha256 of its bearer token equals CKPTGATE_OPA_TOKEN_SHA256 in the
#   server's own environment. ckptgate draws a fresh random token per start and never writes
#   it to disk, so other local users cannot query or change the server. Without the variable,
#   nothing is admitted.
package system.authz

default allow := false

# METADATA
# title: Admit the owner's bearer token
# entrypoint: true
allow if _token_matches(input.identity, opa.runtime().env)

_token_matches(identity, env) if {
	is_string(identity)
	want := env.CKPTGATE_OPA_TOKEN_SHA256
	count(want) == 64
	crypto.sha256(identity) == want
}
