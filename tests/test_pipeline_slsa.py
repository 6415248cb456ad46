"""``ckptgate intake/verify CKPT --attestation slsa.json --trust trust.json``: a per-file SLSA provenance
statement (subjects made with ``in-toto-attestation``), signed as DSSE with a key in a trust file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode
from ckptgate.verify import sign_statement
from tests.verify.oms_helpers import HF
from tests.verify.slsa_helpers import file_hashes, slsa_statement, slsa_trust
from tests.verify.verify_helpers import signer
from tests.pipeline_helpers import ckptgate_json


_cli = ckptgate_json


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("slsa")
    ck = d / "ck"
    shutil.copytree(HF, ck)
    s = signer()
    att = d / "slsa.json"
    att.write_bytes(sign_statement(slsa_statement(file_hashes(ck)), s))
    trust = d / "trust.json"
    trust.write_bytes(slsa_trust(s).raw)
    return {"dir": d, "ck": ck, "att": att, "trust": trust}


def _flipped(case: dict[str, Path]) -> Path:
    """A copy of the checkpoint with one byte of one shard changed."""
    ck = case["dir"] / "changed"
    shutil.copytree(case["ck"], ck)
    target = ck / "model-00002-of-00003.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    target.write_bytes(bytes(data))
    return ck


def test_intake_with_per_file_slsa_provenance_is_allowed_for_pure_data(case: dict[str, Path]) -> None:
    out = case["dir"] / "out"
    res = _cli("intake", str(case["ck"]), "--out", str(out), "--attestation", str(case["att"]),
               "--trust", str(case["trust"]))
    assert res.returncode == 0, res.stdout + res.stderr
    receipt = json.loads(res.stdout)["receipt"]
    assert receipt["decision"]["allow"] is True and receipt["decision"]["plane"] == "pure_data"
    (att,) = receipt["attestations"]
    assert att["signers"][0]["signer_id"] == "release-builder"
    assert any(r["code"] == "attestation_trusted" for r in receipt["decision"]["reasons"])
    assert (out / "model.safetensors.index.json").is_file()


def test_the_reviewer_report_names_the_signer_and_the_builder(case: dict[str, Path]) -> None:
    res = _cli("verify", str(case["ck"]), "--attestation", str(case["att"]), "--trust", str(case["trust"]))
    assert res.returncode == 0, res.stdout + res.stderr
    (att,) = json.loads(res.stdout)["attestations"]
    assert att["digest_matches"] is True and att["method"] == "dsse"
    assert att["signers"][0]["signer_id"] == "release-builder"
    assert att["predicate_type"] == "https://slsa.dev/provenance/v1"
    assert att["files_bound"] == {"match": "path", "files": 4, "extra_subjects": 0}
    assert att["builder"].startswith("https://github.com/example/trainer/")


def test_a_file_removed_after_signing_is_refused_by_policy(case: dict[str, Path]) -> None:
    # The signer attested generation_config.json too; it is gone from the checkpoint, which stays clean.
    s = signer()
    att = case["dir"] / "removed.json"
    att.write_bytes(sign_statement(slsa_statement({**file_hashes(case["ck"]), "generation_config.json": "ab" * 32}), s))
    trust = case["dir"] / "trust-removed.json"
    trust.write_bytes(slsa_trust(s).raw)
    res = _cli("intake", str(case["ck"]), "--out", str(case["dir"] / "never1"), "--attestation", str(att),
               "--trust", str(trust))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    reasons = json.loads(res.stdout)["error"]["reasons"]
    (extra,) = [r for r in reasons if r["code"] == "attestation_extra_subjects"]
    assert extra["evidence"]["manifest"]["extra_subjects"] == 1
    assert not (case["dir"] / "never1").exists()


def test_one_byte_changed_is_refused_as_a_verification_failure(case: dict[str, Path]) -> None:
    ck = _flipped(case)
    res = _cli("intake", str(ck), "--out", str(case["dir"] / "never2"), "--attestation", str(case["att"]),
               "--trust", str(case["trust"]))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    err = json.loads(res.stdout)["error"]
    assert any(r["evidence"].get("error_code") == "verify.statement.file_digest_mismatch" for r in err["reasons"])


def test_a_builder_outside_the_signers_scope_is_untrusted(case: dict[str, Path]) -> None:
    s = signer()
    att = case["dir"] / "other-builder.json"
    att.write_bytes(sign_statement(slsa_statement(file_hashes(case["ck"]), builder="https://evil.example/b"), s))
    trust = case["dir"] / "trust2.json"
    trust.write_bytes(slsa_trust(s).raw)
    res = _cli("intake", str(case["ck"]), "--out", str(case["dir"] / "never3"), "--attestation", str(att),
               "--trust", str(trust))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    assert "attestation_untrusted_signer" in {r["code"] for r in json.loads(res.stdout)["error"]["reasons"]}
