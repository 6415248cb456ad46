"""Every one-field change of the qualified fixture's genuine statement, signed again by the
trusted qualification key, through the real support policy: a row may stay ``supported`` only
while claim rule 3 still holds for what it now says (register, claim rule 3)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from mutations import single_changes
from pipeline_helpers import GATES

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.evidence import matrix
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.verify import KeySigner, verify_attestation
from ckptgate.verify.dsse import canonical_payload, sign_payload
from ckptgate.verify.store import statement_of
from evidence_helpers import EvidenceRepo


def _still_claim_rule_3(p: dict[str, Any], genuine: dict[str, Any], now: datetime) -> None:
    assert p["result"]["status"] == "passed"
    for field in ("candidate_commit", "adapter", "topology"):
        assert p[field] == genuine[field], field
    assert p["fixture"]["digest"] == genuine["fixture"]["digest"]  # the manifest only names the fixture
    # another release named by a passing qualification is a qualified release (the gate is generated
    # from these statements), so only an exact version may stay supported
    assert re.fullmatch(r"\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]*)?", p["producer"]["version"]), p["producer"]
    if GATES["adapters"][genuine["adapter"]["name"]]["producer"] != "*":  # a gate that names its producer
        assert p["producer"]["name"] == genuine["producer"]["name"]
    assert p["result"]["evidence"] == genuine["result"]["evidence"]
    assert isinstance(p["environment"], dict) and p["environment"]
    issued, expires = (datetime.fromisoformat(p["validity"][k].replace("Z", "+00:00"))
                       for k in ("issued_at", "expires_at"))
    assert issued <= now <= expires


def test_a_changed_claim_is_never_supported(qualified_repo: EvidenceRepo) -> None:
    repo = qualified_repo.path
    [stored] = (repo / "attestations").glob("sha256-*/*.dsse.json")
    _, genuine, _ = statement_of(stored.read_bytes())
    digest = Digest.from_filename_stem(stored.parent.name)
    options = EngineOptions(policy_dir=repo / "policies")
    trust, key = load_trust(options), KeySigner.from_pem(qualified_repo.key)
    base = matrix.support_input(repo, trust)
    now = datetime.fromisoformat(base["now"].replace("Z", "+00:00"))
    seen: dict[str, int] = {}
    with engine_for(options) as engine:
        def status(statement: dict[str, Any]) -> str:
            raw = sign_payload(canonical_payload(statement), [key])
            try:
                facts = verify_attestation(raw, source="changed", trust=trust, measured_digest=digest, now=now)
            except VerificationError:
                return "not verified"
            facts_doc = {**facts.to_facts(), "retained_result": matrix.retained_result(repo, statement)}
            rows = engine.evaluate(matrix.ROWS_ENTRYPOINT, {**base, "attestations": [facts_doc]}).result
            mine = [r["status"] for r in rows if r.get("source") == "changed"]
            return mine[0] if mine else "no row"  # not a qualification statement: the policy ignores it

        assert status(genuine) == "supported"
        for statement, how in single_changes(genuine):
            got = status(statement)
            if got == "supported":
                try:
                    _still_claim_rule_3(statement["predicate"], genuine["predicate"], now)
                except AssertionError as e:
                    raise AssertionError(f"supported after {how}: {e}") from None
            seen[got] = seen.get(got, 0) + 1
    assert {"not verified", "supported", "unqualified", "refused"} <= set(seen), seen


def test_a_co_subject_never_inherits_another_fixtures_row(qualified_repo: EvidenceRepo) -> None:
    """Issue #16, F6, in the matrix: the genuine statement made about another fixture Z, with the
    qualified fixture added as a second subject, verifies for the fixture but is refused."""
    repo = qualified_repo.path
    [stored] = (repo / "attestations").glob("sha256-*/*.dsse.json")
    _, genuine, _ = statement_of(stored.read_bytes())
    digest = Digest.from_filename_stem(stored.parent.name)
    other = "ab" * 32
    statement = {**genuine, "subject": [{"name": "other", "digest": {"sha256": other}}, *genuine["subject"]],
                 "predicate": {**genuine["predicate"], "fixture": {**genuine["predicate"]["fixture"],
                                                                   "digest": "sha256:" + other}}}
    options = EngineOptions(policy_dir=repo / "policies")
    trust, key = load_trust(options), KeySigner.from_pem(qualified_repo.key)
    base = matrix.support_input(repo, trust)
    now = datetime.fromisoformat(base["now"].replace("Z", "+00:00"))
    raw = sign_payload(canonical_payload(statement), [key])
    facts = verify_attestation(raw, source="co-subject", trust=trust, measured_digest=digest, now=now)
    assert facts.to_facts()["verification"]["predicate_subject"] == {"fixture.digest": False}
    doc = {**facts.to_facts(), "retained_result": matrix.retained_result(repo, statement)}
    with engine_for(options) as engine:
        rows = engine.evaluate(matrix.ROWS_ENTRYPOINT, {**base, "attestations": [doc]}).result
    [row] = [r for r in rows if r.get("source") == "co-subject"]
    assert row["status"] == "refused"
    assert "attestation_predicate_mismatch" in {r["code"] for r in row["reasons"]}
