"""``ckptgate attest checkpoint``: a training job's provenance, measured as intake measures, signed, and taken
in by ``ckptgate intake --trust`` in every plane (the framework plane included); and each refusal, typed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import InputRejected
from tests.pipeline_helpers import ckptgate_json

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
BUILDER = "https://ci.example/trainer"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    res = ckptgate_json("attest", "keygen", "--out", d / "k", "--trust-out", d / "trust.json", "--builder-id", BUILDER)
    assert res.returncode == 0, res.stderr
    return {"key": d / "k.pem", "trust": d / "trust.json"}


def _doc(text: str) -> dict:
    """The JSON document of a --json run (stderr may start with the configuration notice)."""
    return json.loads("\n".join(line for line in text.splitlines() if not line.startswith("ckptgate:")) or "{}")


def _copy(tmp_path: Path, name: str) -> Path:
    ck = tmp_path / name
    shutil.copytree(DATA / name / "checkpoint", ck)
    return ck


def _attest(ck: Path, keys: dict[str, Path], *extra: object) -> tuple[int, dict]:
    res = ckptgate_json("attest", "checkpoint", ck, "--key", keys["key"], "--builder-id", BUILDER, *extra)
    return res.returncode, _doc(res.stdout or res.stderr)


def _intake(ck: Path, keys: dict[str, Path], att: Path | None = None, out: Path | None = None) -> tuple[int, dict]:
    att = att or ck.parent / (ck.name + ".intoto.dsse.json")
    out = out or ck.parent / "out"
    res = ckptgate_json("intake", ck, "--out", out, "--attestation", att, "--trust", keys["trust"])
    return res.returncode, _doc(res.stdout if res.stdout.strip() else res.stderr)


def _codes(doc: dict) -> set[str]:
    err = doc.get("error", doc)
    reasons = err.get("reasons") or []
    return {r["code"] for r in reasons} | {err.get("code")}


def test_deepspeed_training_provenance_is_taken_in_on_the_framework_plane(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, doc = _attest(ck, keys)
    assert rc == 0, doc
    stmt = doc["statement"]
    internal = stmt["predicate"]["buildDefinition"]["internalParameters"]
    assert internal["format"] == "deepspeed-zero2"
    assert internal["topology"] == {"dp": 2, "world_size": 2}  # measured: two ZeRO partitions, one model state
    assert sorted(s["name"] for s in stmt["subject"]) == sorted(
        p.relative_to(ck).as_posix() for p in ck.rglob("*") if p.is_file()
    )
    assert doc["fixture_digest"] == internal["fixture_digest"]
    deps = {d["name"] for d in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]
            if d["annotations"]["kind"] == "producer"}
    assert deps == {"deepspeed", "torch"}
    rc, receipt = _intake(ck, keys)
    assert rc == 0, receipt
    assert receipt["receipt"]["decision"]["plane"] == "framework"
    assert receipt["receipt"]["decision"]["allow"] is True


def test_a_declared_topology_that_contradicts_the_layout_is_refused_at_attest(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, doc = _attest(ck, keys, "--topology", "zero_stage=3")
    assert rc == 2
    assert doc["error"]["code"] == "usage.topology.contradicts_layout"
    assert doc["error"]["evidence"]["contradictions"]["zero_stage"] == {"declared": 3, "measured": [1, 2]}
    assert not (tmp_path / "deepspeed_zero2.intoto.dsse.json").exists()


def test_a_statement_whose_topology_contradicts_the_layout_is_refused_at_intake(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, doc = _attest(ck, keys, "--dry-run")
    assert rc == 0, doc
    stmt = doc["statement"]
    # consistent in itself (dp=4 of world_size=4), contradicted by the two-partition layout
    stmt["predicate"]["buildDefinition"]["internalParameters"]["topology"].update(dp=4, world_size=4)
    (tmp_path / "stmt.json").write_text(json.dumps(stmt))
    att = tmp_path / "hand.dsse.json"
    res = ckptgate_json("attest", "sign", "--key", keys["key"], "--statement", tmp_path / "stmt.json", "--out", att)
    assert res.returncode == 0, res.stderr
    rc, err = _intake(ck, keys, att)
    assert rc == 3, err
    assert "training_topology_contradicts_layout" in _codes(err)


def test_a_producer_version_without_a_passing_qualification_is_refused(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, doc = _attest(ck, keys, "--producer", "deepspeed=0.14.0")
    assert rc == 0, doc
    rc, err = _intake(ck, keys)
    assert rc == 3, err
    assert "training_producer_not_gated" in _codes(err)


def test_a_builder_id_the_trust_data_does_not_name_is_refused(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    res = ckptgate_json("attest", "checkpoint", ck, "--key", keys["key"], "--builder-id", "https://evil.example/b")
    assert res.returncode == 0, res.stderr
    rc, err = _intake(ck, keys)
    assert rc == 5, err
    assert "attestation_untrusted_signer" in _codes(err)


def test_subjects_that_miss_a_file_are_refused(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, doc = _attest(ck, keys)
    assert rc == 0, doc
    (ck / "added.json").write_text("{}")
    rc, err = _intake(ck, keys)
    assert rc == 5, err
    assert "attestation_rejected" in _codes(err)
    assert "verify.statement.unsigned_file" in json.dumps(err)


def test_dry_run_reports_every_schema_error_with_its_json_path(tmp_path: Path) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    res = ckptgate_json("attest", "checkpoint", ck, "--dry-run", "--dtype", "Not A Dtype", "--builder-id",
                        "b" * 1025)
    assert res.returncode == 2
    err = _doc(res.stdout if res.stdout.strip() else res.stderr)["error"]
    assert err["code"] == "usage.statement_invalid"
    assert {e["path"] for e in err["evidence"]["errors"]} == {
        "/predicate/buildDefinition/internalParameters/dtype",
        "/predicate/runDetails/builder/id",
    }


@pytest.mark.parametrize(("flags", "code"), [
    (("--topology", "tp=3", "--topology", "world_size=2"), "usage.topology.value"),
    (("--topology", "world_size=0"), "usage.topology.value"),
    (("--topology", "fsdp_mode=bogus"), "usage.topology.value"),
    (("--topology", "world_size=99999999999999999999999999"), "usage.topology.value"),
    (("--step", "9007199254740992"), "usage.step.value"),
])
def test_absurd_topology_or_step_flags_are_refused_and_nothing_is_signed(
        tmp_path: Path, keys: dict, flags: tuple[str, ...], code: str) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, doc = _attest(ck, keys, *flags)
    assert rc == 2, doc
    assert doc["error"]["code"] == code and doc["error"]["advice"]
    assert not (tmp_path / "deepspeed_zero2.intoto.dsse.json").exists()


def test_attest_sign_refuses_a_statement_whose_degrees_the_world_size_cannot_hold(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    _, doc = _attest(ck, keys, "--dry-run")
    stmt = doc["statement"]
    stmt["predicate"]["buildDefinition"]["internalParameters"]["topology"].update(tp=2, pp=2, cp=1, dp=2)
    (tmp_path / "bad.json").write_text(json.dumps(stmt))
    res = ckptgate_json("attest", "sign", "--key", keys["key"], "--statement", tmp_path / "bad.json",
                        "--out", tmp_path / "bad.dsse.json")
    assert res.returncode == 2, res.stdout
    err = _doc(res.stdout if res.stdout.strip() else res.stderr)["error"]
    assert err["code"] == "usage.statement_invalid"
    assert [e["path"] for e in err["evidence"]["errors"]] == [
        "/predicate/buildDefinition/internalParameters/topology/world_size"]
    assert not (tmp_path / "bad.dsse.json").exists()


def test_attest_sign_reports_every_schema_error_with_its_json_path(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    _, doc = _attest(ck, keys, "--dry-run")
    stmt = doc["statement"]
    stmt["predicate"]["runDetails"]["builder"]["id"] = ""
    stmt["predicate"]["buildDefinition"]["internalParameters"]["step"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(stmt))
    res = ckptgate_json("attest", "sign", "--key", keys["key"], "--statement", tmp_path / "bad.json",
                        "--out", tmp_path / "bad.dsse.json")
    assert res.returncode == 2
    err = _doc(res.stdout if res.stdout.strip() else res.stderr)["error"]
    assert {e["path"] for e in err["evidence"]["errors"]} == {
        "/predicate/runDetails/builder/id", "/predicate/buildDefinition/internalParameters/step"}
    assert not (tmp_path / "bad.dsse.json").exists()


def test_attest_show_prints_the_training_provenance_in_plain_words(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    rc, _ = _attest(ck, keys)
    assert rc == 0
    res = subprocess.run([sys.executable, "-m", "ckptgate", "attest", "show",
                          str(tmp_path / "deepspeed_zero2.intoto.dsse.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"builder     {BUILDER}" in res.stdout
    assert "deepspeed 0.19.8 (environment)" in res.stdout
    assert "topology    dp=2, world_size=2" in res.stdout


@pytest.mark.parametrize(
    ("name", "plane"),
    [("trainer_peft_lora", "pure_data"), ("megatron_torch_dist", "static_pickle"), ("dcp_torchtitan", "static_pickle")],
)
def test_each_format_is_attested_and_taken_in_with_no_hand_written_json(
    tmp_path: Path, keys: dict, name: str, plane: str
) -> None:
    ck = _copy(tmp_path, name)
    rc, doc = _attest(ck, keys)
    assert rc == 0, doc
    src = Path(doc["envelope"]).with_name(Path(doc["envelope"]).name.removesuffix(".intoto.dsse.json"))
    rc, receipt = _intake(src, keys, out=tmp_path / "out1")
    assert rc == 0, receipt
    assert receipt["receipt"]["decision"]["plane"] == plane
    if name == "trainer_peft_lora":  # a Trainer output dir: the one checkpoint-N/ is attested, as intake selects it
        assert src == ck / "checkpoint-2"
        deps = doc["statement"]["predicate"]["buildDefinition"]["resolvedDependencies"]
        assert {"kind": "base_model", "revision": "0123456789abcdef0123456789abcdef01234567"} in [
            d["annotations"] for d in deps]
        assert any(d["name"] == "peft" and d["annotations"]["source"] == "checkpoint" for d in deps)
        res = ckptgate_json("intake", ck, "--out", tmp_path / "out2", "--attestation", doc["envelope"],
                            "--trust", keys["trust"])
        assert res.returncode == 0, res.stdout + res.stderr  # the sidecar beside checkpoint-2/ is no other entry


def test_format_oms_writes_a_bundle_model_signing_itself_verifies_and_intake_takes_in(tmp_path: Path) -> None:
    import model_signing

    res = ckptgate_json("attest", "keygen", "--out", tmp_path / "ec", "--algorithm", "ecdsa-p256")
    assert res.returncode == 0, res.stderr
    ck = tmp_path / "hf"
    shutil.copytree(DATA / "hf_sharded" / "checkpoint", ck)
    res = ckptgate_json("attest", "checkpoint", ck, "--key", tmp_path / "ec.pem", "--format", "oms")
    assert res.returncode == 0, res.stdout + res.stderr
    bundle = tmp_path / "hf.sig"
    assert _doc(res.stdout)["envelope"] == str(bundle)
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "ec.pub.pem").set_hashing_config(
        model_signing.hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=False)
    ).verify(ck, bundle)  # the reference verifier; raises on any mismatch
    res = ckptgate_json("intake", ck, "--out", tmp_path / "out", "--signature", bundle,
                        "--key", tmp_path / "ec.pub.pem")
    assert res.returncode == 0, res.stdout + res.stderr


def test_format_oms_refuses_a_key_model_signing_cannot_sign_with(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "hf_sharded")
    rc, doc = _attest(ck, keys, "--format", "oms")  # the module's key is Ed25519
    assert rc == 2
    assert doc["error"]["code"] == "usage.oms.key_algorithm"
    assert not (tmp_path / "hf_sharded.sig").exists()


def test_keygen_trust_out_admits_training_provenance_from_any_builder_by_default(tmp_path: Path) -> None:
    res = ckptgate_json("attest", "keygen", "--out", tmp_path / "k", "--trust-out", tmp_path / "trust.json")
    assert res.returncode == 0, res.stderr
    (entry,) = json.loads((tmp_path / "trust.json").read_text())["signers"]
    assert entry["builder_ids"] == ["*"]
    assert "training_provenance" in entry["scopes"] and "https://slsa.dev/provenance/v1" in entry["predicate_types"]
    ck = _copy(tmp_path, "deepspeed_zero2")
    res = ckptgate_json("attest", "checkpoint", ck, "--key", tmp_path / "k.pem", "--builder-id", "https://any.example/b")
    assert res.returncode == 0, res.stderr
    rc, receipt = _intake(ck, {"trust": tmp_path / "trust.json"})
    assert rc == 0, receipt


def test_the_step_is_the_one_its_folders_record_or_none_never_one_by_listing_order(tmp_path: Path) -> None:
    from ckptgate.producer.attest import _step

    (tmp_path / "checkpoint-7").mkdir()
    assert _step(tmp_path / "checkpoint-7") == 7
    one = tmp_path / "save_dir"
    (one / "global_step100").mkdir(parents=True)
    (one / "notes").mkdir()
    assert _step(one) == 100
    (one / "global_step200").mkdir()  # a DeepSpeed save_dir holding two saves: which one is unknown
    assert _step(one) is None
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "global_step5").symlink_to(one / "global_step100")
    assert _step(linked) is None  # a linked folder records nothing of this save


def test_hf_config_records_the_manifest_sha256_intake_records_for_the_same_config(tmp_path: Path, keys: dict) -> None:
    from ckptgate.consolidate.hf.source import read_hf_config

    config = DATA / "megatron_hf_llama" / "hf_config"
    ck = _copy(tmp_path, "hf_sharded")
    rc, doc = _attest(ck, keys, "--hf-config", config)
    assert rc == 0, doc
    internal = doc["statement"]["predicate"]["buildDefinition"]["internalParameters"]
    assert internal["hf_config_manifest_sha256"] == "sha256:" + read_hf_config(config).digest  # intake's digest
    shown = subprocess.run([sys.executable, "-m", "ckptgate", "attest", "show", str(doc["envelope"])],
                           capture_output=True, text=True, timeout=120)
    assert f"hf config   manifest {internal['hf_config_manifest_sha256']}" in shown.stdout
    rc, plain = _attest(_copy(tmp_path / "again", "hf_sharded"), keys)
    assert rc == 0 and "hf_config_manifest_sha256" not in json.dumps(plain["statement"])


def test_hf_config_that_intake_would_refuse_is_refused_at_attest_with_the_same_code(tmp_path: Path, keys: dict) -> None:
    config = tmp_path / "cfg"
    shutil.copytree(DATA / "megatron_hf_llama" / "hf_config", config)
    (config / "modeling_evil.py").write_text("import os\n")
    ck = _copy(tmp_path, "hf_sharded")
    rc, err = _attest(ck, keys, "--hf-config", config)
    assert rc == 4, err
    assert err["error"]["code"] == "hf_config.unlisted_file"
    assert not (tmp_path / "hf_sharded.intoto.dsse.json").exists()


def test_a_tree_with_a_symlink_out_of_it_is_refused_and_nothing_is_written(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    (ck / "global_step2" / "extra.pt").symlink_to("/etc/hostname")  # the walk never hashes it: no subject would
    rc, doc = _attest(ck, keys)
    assert rc == 4, doc
    assert doc["error"]["code"] == "input.walk.not_clean" and "extra.pt" in doc["error"]["message"], doc
    assert not (tmp_path / "deepspeed_zero2.intoto.dsse.json").exists()


def test_a_missing_ranks_file_is_refused_even_when_no_topology_is_declared(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "dcp_torch_save")
    (ck / "__1_0.distcp").unlink()  # rank 1 has not written (or its node's files are not visible here)
    rc, doc = _attest(ck, keys, "--dry-run")
    assert rc == 4, doc
    assert doc["error"]["code"] == "input.attest.incomplete" and "__1_0.distcp" in doc["error"]["message"], doc
    assert "Traceback" not in json.dumps(doc)


def test_a_save_still_being_written_is_refused(tmp_path: Path, keys: dict) -> None:
    ck = _copy(tmp_path, "dcp_torch_save")
    (ck / ".metadata").unlink()  # dcp.save writes .metadata last: before it, no format is recognised
    rc, doc = _attest(ck, keys)
    assert rc == 4, doc
    assert doc["error"]["code"] == "input.attest.format_unknown", doc
    assert not (tmp_path / "dcp_torch_save.intoto.dsse.json").exists()


@pytest.mark.parametrize(("text", "code"), [
    ("{bad", "usage.json.malformed"),
    ('{"lr": NaN}', "usage.json.malformed"),
    ('{"lr": 1, "lr": 2}', "usage.json.duplicate_key"),
])
def test_a_malformed_training_config_is_a_usage_error_not_a_verification_failure(
    tmp_path: Path, keys: dict, text: str, code: str
) -> None:
    ck = _copy(tmp_path, "deepspeed_zero2")
    (tmp_path / "cfg.json").write_text(text)
    rc, doc = _attest(ck, keys, "--training-config", tmp_path / "cfg.json")
    assert rc == 2, doc  # the producer's own flag, not evidence that failed to verify (exit 5)
    assert doc["error"]["code"] == code and doc["error"]["evidence"]["what"] == "training config", doc
    assert not (tmp_path / "deepspeed_zero2.intoto.dsse.json").exists()


@pytest.mark.parametrize("fmt", ["intoto", "oms"])
@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_key_given_as_pem_text_is_refused_without_printing_it(
    tmp_path: Path, keys: dict, monkeypatch: pytest.MonkeyPatch, fmt: str, via: str
) -> None:
    """A CI secret holding the PEM itself, put where a path goes: the error used to repeat it (message and
    advice), printing the private key into the job's log."""
    ck = _copy(tmp_path, "hf_sharded")
    pem = keys["key"].read_text()
    secret = pem.splitlines()[1]
    if via == "env":
        monkeypatch.setenv("CKPTGATE_SIGNING_KEY", pem)
        res = ckptgate_json("attest", "checkpoint", ck, "--format", fmt, "--builder-id", BUILDER)
    else:
        res = ckptgate_json("attest", "checkpoint", ck, "--format", fmt, "--key", pem, "--builder-id", BUILDER)
    assert res.returncode == 2, res.stdout + res.stderr
    assert secret not in res.stdout + res.stderr
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.signing_key_not_a_path"
    assert not list(tmp_path.glob("hf_sharded.*"))


def test_a_process_whose_rng_state_is_missing_is_refused(tmp_path: Path, keys: dict) -> None:
    """A two-process FSDP Trainer save seen from a node that holds rank 0's files only: its DCP shards are both
    there, but rank 1's rng_state_1.pth is not."""
    ck = _copy(tmp_path, "trainer_fsdp_sharded")
    (ck / "checkpoint-2" / "rng_state_1.pth").unlink()
    rc, doc = _attest(ck, keys, "--dry-run")
    assert rc == 4, doc
    assert doc["error"]["code"] == "input.attest.incomplete", doc
    assert doc["error"]["evidence"]["findings"][0] == {"code": "resume.rank_state_missing", "missing": [1],
                                                       "present": [0]}


def test_a_declared_world_size_is_not_held_against_the_rng_state_files(tmp_path: Path, keys: dict) -> None:
    """``save_state`` called on the main process only writes ``random_states_0.pkl``: a declared world of 2
    is attested as declared, not refused as incomplete or contradicted."""
    ck = _copy(tmp_path, "accelerate_save_state")  # one process wrote random_states_0.pkl
    rc, doc = _attest(ck, keys, "--dry-run", "--topology", "world_size=2")
    assert rc == 0, doc


def test_a_trainer_save_from_fewer_processes_than_declared_is_refused(tmp_path: Path, keys: dict) -> None:
    """A Trainer writes ``rng_state_<i>.pth`` on every process when there are several: rank 0's alone, with
    a world of 2 declared, is a node's files missing."""
    ck = _copy(tmp_path, "trainer_llama")
    (ck / "checkpoint-2" / "rng_state.pth").rename(ck / "checkpoint-2" / "rng_state_0.pth")
    rc, doc = _attest(ck / "checkpoint-2", keys, "--dry-run", "--topology", "world_size=2")
    assert rc == 4, doc
    assert doc["error"]["code"] == "input.attest.incomplete", doc
    assert doc["error"]["evidence"]["findings"][0]["missing"] == [1]


def test_a_gap_in_the_rng_state_files_is_refused_before_hashing(tmp_path: Path, keys: dict,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes 0 and 999999999 wrote theirs: the gap is counted, not listed whole (a list of a billion
    indices was a MemoryError), and nothing is hashed first."""
    import ckptgate.producer.attest as attest_mod

    ck = _copy(tmp_path, "accelerate_save_state")
    (ck / "random_states_999999999.pkl").write_bytes((ck / "random_states_0.pkl").read_bytes())

    def no_hashing(*_a: object, **_k: object) -> None:
        raise AssertionError("hashed before the refusal")

    monkeypatch.setattr(attest_mod, "fixture_digest", no_hashing)
    with pytest.raises(InputRejected) as e:
        attest_mod.attest_checkpoint(attest_mod.AttestRequest(src=ck, dry_run=True, environment=False))
    assert e.value.code == "input.attest.incomplete"
    finding = e.value.evidence["findings"][0]
    assert finding["missing"] == list(range(1, 9)) and e.value.evidence["world_size"] == 1_000_000_000


@pytest.mark.parametrize(("name", "gone"), [
    ("deepspeed_zero2", "mp_rank_00_model_states.pt"),
    ("deepspeed_zero3", "zero_pp_rank_1_mp_rank_00_model_states.pt"),
    ("deepspeed_zero2", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
])
def test_a_deepspeed_save_missing_a_ranks_file_is_refused(tmp_path: Path, keys: dict, name: str, gone: str) -> None:
    """A tag folder without its model-states file (or the last rank's optimizer partition) used to be signed."""
    ck = _copy(tmp_path, name)
    (ck / "global_step2" / gone).unlink()
    rc, doc = _attest(ck, keys)
    assert rc == 4, doc
    assert doc["error"]["code"] == "input.attest.incomplete" and gone in doc["error"]["message"], doc
    assert not (tmp_path / f"{name}.intoto.dsse.json").exists()
