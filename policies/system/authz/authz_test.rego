package system.authz_test

import data.system.authz

_abc_sha256 := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

test_token_with_matching_digest_is_admitted if {
	authz._token_matches("abc", {"CKPTGATE_OPA_TOKEN_SHA256": _abc_sha256})
}

test_wrong_token_is_refused if {
	not authz._token_matches("abd", {"CKPTGATE_OPA_TOKEN_SHA256": _abc_sha256})
}

test_missing_digest_refuses_everything if {
	not authz._token_matches("abc", {})
}

test_missing_identity_is_refused if {
	not authz._token_matches(null, {"CKPTGATE_OPA_TOKEN_SHA256": _abc_sha256})
}

test_short_digest_is_refused if {
	not authz._token_matches("", {"CKPTGATE_OPA_TOKEN_SHA256": ""})
}

test_allow_is_false_without_the_server_environment if {
	not authz.allow with input as {"identity": "abc"}
}

test_allow_admits_the_owner_token_from_the_server_environment if {
	authz.allow with input as {"identity": "abc"}
		with opa.runtime as {"env": {"CKPTGATE_OPA_TOKEN_SHA256": _abc_sha256}}
}
