"""A co-subject never inherits another fixture's statement (issue #16, F6).

A trusted qualification whose ``predicate.fixture.digest`` is Z, with the checkpoint Y added as a
second subject, verifies for Y (a subject is Y) but says nothing about Y.  Python reports which
subject it bound and whether the predicate names it; ``ckptgate.trust`` refuses it for every
command: ``intake``, ``decide`` and ``verify`` through the CLI and the real embedded OPA.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from pipeline_helpers import FIXTURES, attest, make_signer, qualification
from verify_helpers import FIXTURE_HEX

from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import ExitCode
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.verify import KeySigner, check_statement, verify_attestation
from ckptgate.verify.dsse import sign_statement
from ckptgate.verify.binding import bind_subject
from ckptgate.verify.trust import TrustData

pytestmark = pytest.mark.opa

CODE = "attestation_predicate_mismatch"


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("co-subject")
    src = tmp / "hf_sharded" / "checkpoint"
    shutil.copytree(FIXTURES / "hf_sharded" / "checkpoint", src)
    meta = json.loads((FIXTURES / "hf_sharded" / "meta.json").read_text())
    signer = make_signer(tmp)
    with SafeTree.open(src) as tree:
        fmt = str(inspect_open_tree(tree).format)
        measured = fixture_digest(tree).digest.prefixed()
    other = "sha256:" + FIXTURE_HEX  # Z: the fixture the statement is about
    assert other != measured
    statement = qualification(src, other, fmt=fmt, meta=meta)
    statement["subject"].append({"name": "checkpoint", "digest": {"sha256": measured.removeprefix("sha256:")}})
    check_statement(statement)  # a well-formed statement: fixture.digest names one of its subjects
    co_subject = tmp / "co-subject.json"
    co_subject.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    genuine = attest(signer, src, tmp / "genuine.json", fmt=fmt, meta=meta)
    return {"src": src, "tmp": tmp, "signer": signer, "measured": measured, "other": other,
            "co_subject": co_subject, "genuine": genuine}


def _codes(reasons: list[dict[str, Any]]) -> set[str]:
    return {r["code"] for r in reasons}


def test_python_reports_the_bound_subject_and_that_the_predicate_names_another(case: dict[str, Any]) -> None:
    trust = TrustData.from_file(case["signer"].trust_file)
    from ckptgate.decide import now_utc

    va = verify_attestation(case["co_subject"].read_bytes(), source="co", trust=trust,
                            measured_digest=Digest.parse(case["measured"]), now=now_utc())
    facts = va.to_facts()["verification"]
    assert facts["subject_digest"] == case["measured"]
    assert facts["predicate_subject"] == {"fixture.digest": False}
    genuine = verify_attestation(case["genuine"].read_bytes(), source="g", trust=trust,
                                 measured_digest=Digest.parse(case["measured"]), now=now_utc())
    assert genuine.to_facts()["verification"]["predicate_subject"] == {"fixture.digest": True}
    # bound to Z instead (Z's own bytes), the same statement is about its subject
    assert bind_subject(json.loads(json.dumps(va.statement)), Digest.parse(case["other"])).predicate_matches is True


def test_decide_denies_the_co_subject_and_allows_the_genuine_statement(case: dict[str, Any]) -> None:
    trust = case["signer"].trust_file
    res = _cli("decide", case["src"], "--attestation", case["co_subject"], "--trust", trust, "--json")
    assert res.returncode == ExitCode.DENIED, res.stderr
    doc = json.loads(res.stdout)
    assert doc["decision"]["allow"] is False
    assert CODE in _codes(doc["decision"]["reasons"])
    assert "attestation_trusted" not in _codes(doc["decision"]["reasons"])
    ok = _cli("decide", case["src"], "--attestation", case["genuine"], "--trust", trust, "--json")
    assert ok.returncode == ExitCode.OK, ok.stdout + ok.stderr  # same key, same checkpoint: only the subject differs


def test_intake_denies_the_co_subject_and_publishes_nothing(case: dict[str, Any]) -> None:
    dst = case["tmp"] / "out"
    res = _cli("intake", case["src"], "--out", dst, "--attestation", case["co_subject"],
               "--trust", case["signer"].trust_file, "--json")
    assert res.returncode == ExitCode.DENIED, res.stdout + res.stderr
    err = json.loads(res.stdout)["error"]
    assert CODE in _codes(err["reasons"])
    assert not dst.exists()
    assert not [p for p in case["tmp"].iterdir() if "staging" in p.name]


def test_verify_report_denies_and_says_the_digest_does_not_match(case: dict[str, Any]) -> None:
    res = _cli("verify", case["src"], "--attestation", case["co_subject"], "--trust", case["signer"].trust_file,
               "--json")
    assert res.returncode == ExitCode.DENIED, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["decision"]["allow"] is False
    assert CODE in _codes(doc["decision"]["reasons"])
    [att] = doc["attestations"]
    assert att["digest_matches"] is False and doc["digest_matches_any_attestation"] is False
