"""Per-file in-toto subjects (SLSA provenance v1 made with ``in-toto-attestation``, signed as DSSE): a
statement binds when every measured file is covered by a subject with the same sha256, and each attack is
refused with a typed ``verify.statement.*`` code."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify import sign_statement, verify_attestation
from ckptgate.verify.binding import bind_manifest
from tests.verify.slsa_helpers import slsa_statement, slsa_trust
from tests.verify.verify_helpers import NOW, signer

FIXTURE = "sha256:" + "ef" * 32
FILES = {"model-00001-of-00002.safetensors": "11" * 32, "model-00002-of-00002.safetensors": "22" * 32,
         "model.safetensors.index.json": "33" * 32}


def _verify(stmt: dict[str, Any], manifest: dict[str, str]) -> Any:
    s = signer()
    return verify_attestation(sign_statement(stmt, s), source="slsa.json", trust=slsa_trust(s),
                              measured_digest=Digest.parse(FIXTURE), now=NOW, manifest=manifest)


def _refused(code: str, stmt: dict[str, Any], manifest: dict[str, str]) -> VerificationError:
    with pytest.raises(VerificationError) as e:
        _verify(stmt, manifest)
    assert e.value.code == code, e.value.message
    return e.value


def test_per_file_subjects_bind_to_the_measured_manifest() -> None:
    va = _verify(slsa_statement(FILES), dict(FILES))
    facts = va.to_facts()["verification"]
    assert facts["binding"] == "manifest" and facts["manifest_matches_fixture"] is True
    assert facts["manifest"] == {"match": "path", "files": 3, "extra_subjects": 0}
    assert facts["subject_digest"] == FIXTURE and "subjects_bound_to_files" in facts["checks"]
    assert va.statement["predicate"]["runDetails"]["builder"]["id"].startswith("https://github.com/example/")


def test_subjects_beyond_the_checkpoint_are_counted_not_refused() -> None:
    stmt = slsa_statement({**FILES, "tokenizer.json": "44" * 32, "README.md": "55" * 32})
    assert _verify(stmt, dict(FILES)).to_facts()["verification"]["manifest"]["extra_subjects"] == 2


def test_a_file_removed_after_signing_leaves_an_extra_subject_for_policy() -> None:
    manifest = {k: v for k, v in FILES.items() if k != "model-00002-of-00002.safetensors"}
    assert _verify(slsa_statement(FILES), manifest).to_facts()["verification"]["manifest"]["extra_subjects"] == 1


def test_a_file_added_after_signing_is_unsigned() -> None:
    e = _refused("verify.statement.unsigned_file", slsa_statement(FILES), {**FILES, "extra.bin": "66" * 32})
    assert e.evidence["files"] == ["extra.bin"]


def test_one_byte_changed_is_a_digest_mismatch() -> None:
    manifest = {**FILES, "model-00001-of-00002.safetensors": "77" * 32}
    e = _refused("verify.statement.file_digest_mismatch", slsa_statement(FILES), manifest)
    assert e.evidence["files"] == ["model-00001-of-00002.safetensors"]


def test_a_renamed_file_is_refused() -> None:
    manifest = {k.replace("00001", "00009"): v for k, v in FILES.items()}
    _refused("verify.statement.renamed_file", slsa_statement(FILES), manifest)


def test_a_statement_for_another_model_is_a_subject_mismatch() -> None:
    other = {"adapter_model.safetensors": "88" * 32, "adapter_config.json": "99" * 32}
    _refused("verify.statement.subject_mismatch", slsa_statement(other), dict(FILES))


def test_bare_basenames_match_nested_files_when_every_basename_is_unique() -> None:
    nested = {f"global_step2/{k}": v for k, v in FILES.items()}
    facts = _verify(slsa_statement(FILES), nested).to_facts()["verification"]
    assert facts["manifest"]["match"] == "basename"


def test_ambiguous_basenames_are_refused() -> None:
    nested = {"a/model.safetensors": "11" * 32, "b/model.safetensors": "22" * 32}
    stmt = slsa_statement({"model.safetensors": "11" * 32})
    e = _refused("verify.statement.ambiguous_basename", stmt, nested)
    assert e.evidence["files"] == {"model.safetensors": ["a/model.safetensors", "b/model.safetensors"]}


def test_one_name_with_two_digests_is_refused() -> None:
    stmt = slsa_statement(FILES)
    stmt["subject"].append({"name": "model.safetensors.index.json", "digest": {"sha256": "00" * 32}})
    _refused("verify.statement.duplicate_subject", stmt, dict(FILES))


def test_the_fixture_digest_subject_path_is_unchanged() -> None:
    stmt = slsa_statement({"ckpt": FIXTURE.removeprefix("sha256:")})
    facts = _verify(stmt, dict(FILES)).to_facts()["verification"]
    assert facts["binding"] == "subject" and "manifest" not in facts and "subject_digest" in facts["checks"]


def test_without_a_manifest_a_per_file_statement_does_not_bind() -> None:
    s = signer()
    with pytest.raises(VerificationError) as e:
        verify_attestation(sign_statement(slsa_statement(FILES), s), source="x", trust=slsa_trust(s),
                           measured_digest=Digest.parse(FIXTURE), now=NOW)
    assert e.value.code == "verify.statement.subject_mismatch"


def test_a_ckptgate_predicate_never_binds_file_by_file() -> None:
    from tests.verify.verify_helpers import statement, trust_for

    stmt = copy.deepcopy(statement())
    stmt["subject"] = [{"name": k, "digest": {"sha256": v}} for k, v in FILES.items()]
    stmt["predicate"]["fixture"]["digest"] = "sha256:" + FILES["model.safetensors.index.json"]
    s = signer()
    with pytest.raises(VerificationError) as e:
        verify_attestation(sign_statement(stmt, s), source="x", trust=trust_for(s), measured_digest=Digest.parse(FIXTURE),
                           now=NOW, manifest=dict(FILES))
    assert e.value.code == "verify.statement.subject_mismatch"


def test_bind_manifest_is_exact_about_names() -> None:
    stmt = slsa_statement({"./model.safetensors": "11" * 32})
    with pytest.raises(VerificationError) as e:
        bind_manifest(stmt, {"model.safetensors": "11" * 32})
    assert e.value.code == "verify.statement.renamed_file"


def test_a_per_file_statement_checked_against_a_digest_alone_says_to_measure_the_files() -> None:
    """``attest verify FILE --digest``: a statement naming each file cannot bind one fixture digest; the
    refusal says so, and how to verify it, instead of "made for other bytes"."""
    s = signer()
    with pytest.raises(VerificationError) as e:
        verify_attestation(sign_statement(slsa_statement(FILES), s), source="slsa.json", trust=slsa_trust(s),
                           measured_digest=Digest.parse(FIXTURE), now=NOW)
    assert e.value.code == "verify.statement.subject_mismatch"
    assert "3 files, one subject each" in e.value.message and "--checkpoint DIR" in e.value.diagnostics()
    assert "other bytes" not in e.value.diagnostics()
