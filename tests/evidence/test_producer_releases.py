"""One fixture digest, several producer releases (issue #31, item 1): a qualification names every
other release whose generation record (``written_by/<name>.json``, kept by the farm when that
release wrote exactly the fixture's bytes) a signed fixture-provenance statement vouches for; the
matrix gets one row per release and the generated gate admits each.  No record, no statement, a
record naming other bytes, or a statement that is missing: no row for that release."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from evidence_helpers import REPO, commit_all, git

from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.evidence import matrix
from ckptgate.evidence.fixtures import find_fixture
from ckptgate.evidence.qualify import qualify
from ckptgate.verify import (
    PROVENANCE_PREDICATE_TYPE,
    QUALIFICATION_PREDICATE_TYPE,
    generate_keypair,
    trust_entry,
)
from ckptgate.verify.store import statement_of

FIXTURE = "fsdp_full"
DATA = Path("tests") / "fixtures" / "data" / FIXTURE


def _record(meta: dict[str, Any], name: str, torch: str) -> dict[str, Any]:
    """The meta.json another environment wrote for the same bytes (as farm.py keeps it)."""
    rec = copy.deepcopy(meta)
    rec["name"] = name
    rec["versions"]["torch"] = torch
    rec["regenerate"] = f"python3 scripts/farm.py run --only torch-{torch}"
    return rec


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """fsdp_full (torch 2.13.0) with records from 2.10.0 and 2.15.0 (its bytes), 2.13.0 in another
    environment (the same release), and 2.11.0 naming other bytes; qualified, matrix built."""
    root = tmp_path_factory.mktemp("releases")
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(REPO / "policies", repo / "policies", ignore=shutil.ignore_patterns(".opa*", "__pycache__"))
    shutil.copytree(REPO / DATA, repo / DATA, ignore=shutil.ignore_patterns("written_by"))
    meta = json.loads((repo / DATA / "meta.json").read_text())
    _write(repo / DATA / "written_by" / "fsdp_full_pt210.json", _record(meta, "fsdp_full_pt210", "2.10.0"))
    _write(repo / DATA / "written_by" / "fsdp_full_pt215.json", _record(meta, "fsdp_full_pt215", "2.15.0"))
    _write(repo / DATA / "written_by" / "fsdp_full_other_env.json", _record(meta, "fsdp_full_other_env", "2.13.0"))
    other = _record(meta, "fsdp_full_pt211", "2.11.0")
    other["checkpoint_files"]["model.pt"]["sha256"] = "0" * 64
    _write(repo / DATA / "written_by" / "fsdp_full_pt211.json", other)
    private, public = generate_keypair("ed25519")
    key = root / "qualify.pem"
    key.write_bytes(private)
    entry = trust_entry(public, signer_id="ci-qualification",
                        predicate_types=[QUALIFICATION_PREDICATE_TYPE, PROVENANCE_PREDICATE_TYPE],
                        scopes=["qualification", "provenance"])
    _write(repo / "policies" / "ckptgate" / "config" / "trust" / "data.json", {"signers": [entry]})
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, "code")
    qualify(repo, find_fixture(repo, FIXTURE), "fsdp-full", key=key, options=_options(repo))
    return repo, key


def _options(repo: Path) -> EngineOptions:
    return EngineOptions(policy_dir=repo / "policies")


def _built(repo: Path) -> matrix.Matrix:
    options = _options(repo)
    trust = load_trust(options)
    with engine_for(options, trust) as engine:
        return matrix.build(repo, engine, trust)


def _fsdp_rows(m: matrix.Matrix) -> dict[str, dict[str, Any]]:
    return {str(r["producer_version"]): r for r in m.rows if r.get("adapter") == "fsdp-full"}


def _qualification(repo: Path) -> tuple[Path, dict[str, Any]]:
    [path] = (repo / "attestations").glob("sha256-*/*qualification*.dsse.json")
    return path, statement_of(path.read_bytes())[1]


def _clone(repo: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "clone"
    shutil.copytree(repo, dest)
    return dest


def test_the_qualification_names_each_other_release_with_its_signed_provenance(repo: tuple[Path, Path]) -> None:
    path, statement = _qualification(repo[0])
    releases = statement["predicate"]["producer_releases"]
    assert statement["predicate"]["producer"] == {"name": "torch", "version": "2.13.0"}
    assert [(r["name"], r["version"], r["manifest"]) for r in releases] == [
        ("torch", "2.10.0", f"{DATA.as_posix()}/written_by/fsdp_full_pt210.json"),
        ("torch", "2.15.0", f"{DATA.as_posix()}/written_by/fsdp_full_pt215.json"),
    ]
    for r in releases:
        _, prov, _ = statement_of((repo[0] / r["provenance"]).read_bytes())
        assert prov["predicateType"] == PROVENANCE_PREDICATE_TYPE
        assert [sub["digest"] for sub in prov["subject"]] == [statement["subject"][0]["digest"]]
        assert prov["predicate"]["fixture"]["manifest"] == r["manifest"]
        assert prov["predicate"]["producer"]["version"] == r["version"]
        assert prov["predicate"]["producers"]["torch"] == r["version"]
    # The retained log says which record named no release, and why.
    log = json.loads((repo[0] / statement["predicate"]["result"]["evidence"]["location"]).read_text())
    [refused] = log["producer_releases"]["refused"]
    assert refused["manifest"].endswith("written_by/fsdp_full_pt211.json")
    assert refused["code"] == "evidence.provenance.meta_mismatch"
    assert path.is_file()


def test_one_supported_row_and_one_gate_version_per_release(repo: tuple[Path, Path]) -> None:
    built = _built(repo[0])
    rows = _fsdp_rows(built)
    assert sorted(rows) == ["2.10.0", "2.13.0", "2.15.0"]
    assert {v: r["status"] for v, r in rows.items()} == dict.fromkeys(rows, "supported")
    assert len({r["fixture_digest"] for r in rows.values()}) == 1
    assert rows["2.10.0"]["evidence"]["manifest"].endswith("fsdp_full_pt210.json")
    gate = built.qualified["adapters"]["fsdp-full"]
    assert gate["versions"] == {"fsdp-full": ["2.10.0", "2.13.0", "2.15.0"]}
    by_version = {r["producer_version"]: r for r in gate["rows"]}
    assert by_version["2.10.0"]["provenance"] == rows["2.10.0"]["evidence"]["provenance"]
    assert "provenance" not in by_version["2.13.0"]
    md = built.files()["SUPPORT.md"].decode()
    assert "| torch 2.10.0 | fsdp_full (" in md and "written_by/fsdp_full_pt210.json" in md


def test_a_missing_provenance_statement_leaves_that_release_unqualified(
    repo: tuple[Path, Path], tmp_path: Path
) -> None:
    clone = _clone(repo[0], tmp_path)
    _, statement = _qualification(clone)
    gone = next(r for r in statement["predicate"]["producer_releases"] if r["version"] == "2.10.0")
    (clone / gone["provenance"]).unlink()
    built = _built(clone)
    row = _fsdp_rows(built)["2.10.0"]
    assert row["status"] == "unqualified"
    assert [r["code"] for r in row["reasons"]] == ["producer_release_unproven"]
    assert _fsdp_rows(built)["2.15.0"]["status"] == "supported"
    assert built.qualified["adapters"]["fsdp-full"]["versions"] == {"fsdp-full": ["2.13.0", "2.15.0"]}


def test_a_provenance_statement_for_another_release_does_not_vouch(repo: tuple[Path, Path], tmp_path: Path) -> None:
    """The qualification names 2.10.0 but points at the statement of 2.15.0: no row, no gate entry."""
    from ckptgate.verify import AttestationStore, KeySigner
    from ckptgate.verify.dsse import sign_statement

    clone = _clone(repo[0], tmp_path)
    path, statement = _qualification(clone)
    releases = statement["predicate"]["producer_releases"]
    releases[0]["provenance"] = releases[1]["provenance"]
    path.unlink()
    AttestationStore(clone / "attestations").add(sign_statement(statement, KeySigner.from_pem(repo[1])))
    built = _built(clone)
    assert _fsdp_rows(built)["2.10.0"]["status"] == "unqualified"
    assert "2.10.0" not in built.qualified["adapters"]["fsdp-full"]["versions"]["fsdp-full"]


def test_the_intake_gate_admits_each_named_release_and_refuses_others(repo: tuple[Path, Path], tmp_path: Path) -> None:
    """The generated gate, written as `ckptgate matrix build` does, lets intake take in the fixture's
    bytes under a trusted statement naming torch 2.10.0 or 2.15.0, and refuses 2.11.0 (its record
    names other bytes) and 2.9.0 (no record)."""
    import sys

    from ckptgate.errors import PolicyDenied
    from ckptgate.pipeline import intake

    sys.path.insert(0, str(REPO / "tests"))
    from pipeline_helpers import attest, make_signer

    clone = _clone(repo[0], tmp_path)
    gate_file = clone / "policies" / "ckptgate" / "config" / "qualified" / "data.json"
    matrix.write_gate(_built(clone), gate_file)
    assert json.loads(gate_file.read_text())["adapters"]["fsdp-full"]["versions"]["fsdp-full"] == [
        "2.10.0", "2.13.0", "2.15.0"]
    signer = make_signer(tmp_path)
    options = EngineOptions(policy_dir=clone / "policies", trust_file=signer.trust_file)
    src = clone / DATA / "checkpoint"
    meta = json.loads((clone / DATA / "meta.json").read_text())
    for version in ("2.10.0", "2.15.0"):
        att = attest(signer, src, tmp_path / f"{version}.json", fmt="fsdp-full", meta=meta, version=version)
        intake(src, tmp_path / f"out-{version}", attestations=[att], options=options)
        assert (tmp_path / f"out-{version}").is_dir()
    for version in ("2.11.0", "2.9.0"):
        att = attest(signer, src, tmp_path / f"{version}.json", fmt="fsdp-full", meta=meta, version=version)
        with pytest.raises(PolicyDenied) as e:
            intake(src, tmp_path / f"out-{version}", attestations=[att], options=options)
        assert e.value.code == "policy.producer_release_unqualified"
        assert not (tmp_path / f"out-{version}").exists()
