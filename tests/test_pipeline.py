"""The intake pipeline end to end on a real HF sharded checkpoint, through the real embedded OPA.

Every refusal case checks: non-zero exit with a stable code, a policy reason in plain words
(human and --json), and DST absent afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import ckptgate.grouped as grouped
import ckptgate.measure as measure
import ckptgate.onepass as onepass
import ckptgate.outcome as outcome
import ckptgate.pipeline as pipeline
from ckptgate.decide.engine import EmbeddedOpa
from ckptgate.demo import demo_statement
from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import EngineUnavailable, ExitCode, InputRejected, PolicyDenied, UsageError
from ckptgate.inspect import SafeTree
from ckptgate.decide.options import EngineOptions
from ckptgate.pipeline import intake
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, KeySigner, generate_keypair, trust_entry
from ckptgate.verify.dsse import sign_statement

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"


@pytest.fixture
def setup(tmp_path):
    """A copy of the real HF fixture, a trusted throwaway key, and an untrusted one."""
    src = tmp_path / "ckpt"
    shutil.copytree(HF, src)
    keys = {}
    for name in ("trusted", "untrusted"):
        priv, pub = generate_keypair("ed25519")
        (tmp_path / f"{name}.pem").write_bytes(priv)
        keys[name] = (tmp_path / f"{name}.pem", pub)
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps({"signers": [trust_entry(keys["trusted"][1], signer_id="test-key",
                                                         predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}))
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()

    def attest(name="trusted", *, subject=None, path=None, status="passed"):
        statement = demo_statement(Digest.parse(subject or digest), "hf_sharded", producer=("huggingface_hub", "2.4.0"))
        statement["predicate"]["result"]["status"] = status
        out = path or tmp_path / f"att-{name}-{(subject or digest)[7:15]}.json"
        out.write_bytes(sign_statement(statement, KeySigner.from_pem(keys[name][0])))
        return out

    return {"src": src, "trust": trust, "attest": attest, "dst": tmp_path / "out", "tmp": tmp_path}


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_allowed_intake_publishes_bit_identical_shards_and_a_receipt(setup):
    import torch
    from safetensors.torch import load_file

    res = intake(setup["src"], setup["dst"], attestations=[setup["attest"]()],
                 options=EngineOptions(trust_file=setup["trust"]), max_shard_bytes=700)
    receipt = json.loads((setup["dst"] / "ckptgate-receipt.json").read_text())
    assert receipt["decision"]["allow"] is True and receipt["decision"]["id"]
    assert receipt["policy_revision"].startswith("sha256:")
    assert receipt["input"]["digest"] == res.evaluation.digest.digest.prefixed()
    assert receipt["decision"]["fixture_digest"] == receipt["input"]["digest"]  # the bytes it was decided for
    src_tensors, out_tensors = {}, {}
    for f in HF.glob("*.safetensors"):
        src_tensors.update(load_file(str(f)))
    for o in receipt["outputs"]:
        if o["file"].endswith(".safetensors"):
            out_tensors.update(load_file(str(setup["dst"] / o["file"])))
    assert src_tensors.keys() == out_tensors.keys()
    for k, v in src_tensors.items():
        assert out_tensors[k].dtype == v.dtype and out_tensors[k].shape == v.shape
        assert torch.equal(out_tensors[k].flatten().view(torch.uint8), v.flatten().view(torch.uint8))


def test_intake_casts_floating_point_tensors_only_when_asked(setup):
    """``--dtype bf16``: every float tensor as torch's ``.to(torch.bfloat16)`` gives it, the rest
    untouched; the receipt records the cast and the hashes of the cast files."""
    import hashlib

    import torch
    from safetensors.torch import load_file

    out = cli("intake", setup["src"], "--out", setup["dst"], "--trust", setup["trust"],
              "--attestation", setup["attest"](), "--dtype", "bf16", "--json")
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout)["receipt"]
    assert receipt["plan"]["cast"]["dtype"] == "BF16" and receipt["plan"]["cast"]["tensors"] > 0
    src_tensors, out_tensors = {}, {}
    for f in HF.glob("*.safetensors"):
        src_tensors.update(load_file(str(f)))
    for o in receipt["outputs"]:
        data = (setup["dst"] / o["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == o["sha256"]
        if o["file"].endswith(".safetensors"):
            out_tensors.update(load_file(str(setup["dst"] / o["file"])))
    assert src_tensors.keys() == out_tensors.keys()
    assert any(v.dtype != torch.bfloat16 and v.is_floating_point() for v in src_tensors.values())
    for k, v in src_tensors.items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert out_tensors[k].dtype == want.dtype
        assert torch.equal(out_tensors[k].flatten().view(torch.uint8), want.flatten().view(torch.uint8))
    index = json.loads((setup["dst"] / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in out_tensors.values())


def _refused(setup, attestations, expected_code, exit_code=ExitCode.DENIED):
    args = ["intake", setup["src"], "--out", setup["dst"], "--trust", setup["trust"]]
    for a in attestations:
        args += ["--attestation", a]
    human = cli(*args)
    assert human.returncode == exit_code, human.stderr
    assert expected_code in human.stderr and "Traceback" not in human.stderr
    machine = cli(*args, "--json")
    assert machine.returncode == exit_code
    err = json.loads(machine.stdout)["error"]
    assert expected_code in [r["code"] for r in err["reasons"]]
    assert all(r["message"] for r in err["reasons"])
    assert not setup["dst"].exists()
    assert not [p for p in setup["tmp"].iterdir() if "staging" in p.name]
    return err


def test_missing_attestation_is_denied(setup):
    _refused(setup, [], "attestation_missing")


def test_tampered_signature_is_denied(setup):
    att = setup["attest"]()
    env = json.loads(att.read_text())
    sig = env["signatures"][0]["sig"]
    env["signatures"][0]["sig"] = ("A" if sig[0] != "A" else "B") + sig[1:]
    att.write_text(json.dumps(env))
    err = _refused(setup, [att], "attestation_rejected", ExitCode.VERIFICATION_FAILED)
    assert any("signature" in r["message"] for r in err["reasons"])


def test_attestation_for_another_fixture_is_denied(setup):
    err = _refused(setup, [setup["attest"](subject="sha256:" + "0" * 64)], "attestation_rejected",
                   ExitCode.VERIFICATION_FAILED)
    assert any("subject" in r["message"] or "digest" in r["message"] for r in err["reasons"])


def test_attestation_from_an_untrusted_key_is_denied(setup):
    err = _refused(setup, [setup["attest"]("untrusted")], "attestation_rejected", ExitCode.VERIFICATION_FAILED)
    assert "--trust" in err["advice"]
    [reason] = [r for r in err["reasons"] if r["code"] == "attestation_rejected"]
    assert "keyid" in reason["message"] and "--trust" in reason["message"]  # names the signer and the way in


@pytest.mark.parametrize("status", ["failed", "error"])
def test_a_trusted_qualification_that_did_not_pass_is_denied(setup, status):
    """A qualification retains its result: one that failed or errored qualifies nothing."""
    err = _refused(setup, [setup["attest"](status=status)], "attestation_result_not_passed")
    assert any(status in r["message"] for r in err["reasons"])


def test_unreachable_opa_is_engine_unavailable_and_publishes_nothing(setup):
    res = cli("intake", setup["src"], "--out", setup["dst"],  # a remote engine brings its own trust data
              "--attestation", setup["attest"](), "--opa-url", "http://127.0.0.1:9", "--json")
    assert res.returncode == ExitCode.ENGINE_UNAVAILABLE
    assert json.loads(res.stdout)["error"]["code"].startswith("engine.")
    assert not setup["dst"].exists()


def test_opa_killed_mid_run_is_a_deny_with_no_output_and_no_orphan(setup, monkeypatch):
    """The engine dies after start-up, before the decision: fail closed."""
    import ckptgate.decide.options as options

    started = []
    real_open = options.open_engine

    def open_then_kill(**kw):
        engine = real_open(**kw)
        started.append(engine.pid)
        os.kill(engine.pid, signal.SIGKILL)
        return engine

    monkeypatch.setattr(options, "open_engine", open_then_kill)
    with pytest.raises(EngineUnavailable):
        intake(setup["src"], setup["dst"], attestations=[setup["attest"]()],
               options=EngineOptions(trust_file=setup["trust"]))
    assert not setup["dst"].exists()
    assert started and not Path(f"/proc/{started[0]}").exists() or \
        Path(f"/proc/{started[0]}/stat").read_text().split()[2] == "Z"
    assert not EmbeddedOpa._live


def test_existing_destination_is_a_usage_error_and_untouched(setup):
    setup["dst"].mkdir()
    (setup["dst"] / "keep").write_text("x")
    res = cli("intake", setup["src"], "--out", setup["dst"], "--attestation", setup["attest"](),
              "--trust", setup["trust"])
    assert res.returncode == ExitCode.USAGE
    assert (setup["dst"] / "keep").read_text() == "x"


def test_demo_output_equals_its_input(tmp_path):
    res = cli("demo", "--workdir", tmp_path / "demo", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["decision"]["allow"] is True
    assert doc["tensors_compared"] == 6
    assert Path(doc["destination"], "model.safetensors.index.json").exists()


def test_malicious_pickle_is_rejected_by_content_and_never_executed(tmp_path):
    """A pickle named like weights, whose execution would write a canary: exit 4, nothing runs."""
    import pickle

    canary = tmp_path / "CANARY"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    res = cli("intake", src, "--out", tmp_path / "out", "--json")
    assert res.returncode == ExitCode.INPUT_REJECTED, res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["code"] == "input.refused_by_policy"
    assert "inspection_not_clean" in [r["code"] for r in err["reasons"]]
    assert not canary.exists()
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_refused_by_its_structure_is_not_hashed_in_full(tmp_path, monkeypatch):
    """attack catalogue: a sparse file behind a broken header.  The policy's precheck refuses
    from the inspection while the digest runs, the digest stops, and nothing is published."""
    src, size = tmp_path / "ckpt", 64 << 30
    src.mkdir()
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()
    with open(src / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(size)  # sparse: 64 GiB of zeros behind a header whose tensor needs 8 bytes, not 4
    hashed = []
    real = measure.hash_files
    monkeypatch.setattr(measure, "hash_files", lambda tree, paths, **kw: real(tree, paths, **{**kw, "progress": hashed.append}))
    with pytest.raises(InputRejected) as e:
        intake(src, tmp_path / "out", attestations=[])
    assert e.value.code == "input.refused_by_policy"
    assert e.value.evidence["before_digest"] is True
    assert "inspection_not_clean" in [r["code"] for r in e.value.reasons]
    assert sum(hashed) < size // 2, "the digest went on after the refusal"
    assert not (tmp_path / "out").exists()


def test_a_precheck_that_cannot_be_asked_stops_the_digest_and_is_raised(tmp_path, monkeypatch):
    """An engine failure during the precheck is the decision's failure too (fail closed): the
    digest stops rather than hashing on for a decision that cannot come."""
    src, size = tmp_path / "ckpt", 64 << 30
    src.mkdir()
    with open(src / "blob.bin", "wb") as f:
        f.truncate(size)

    class Unreachable:
        def evaluate(self, entrypoint, doc):
            raise EngineUnavailable("engine.unreachable", "the policy engine could not be queried")

        def close(self):
            pass

    hashed = []
    real = measure.hash_files
    monkeypatch.setattr(measure, "hash_files", lambda tree, paths, **kw: real(tree, paths, **{**kw, "progress": hashed.append}))
    with SafeTree.open(src) as tree, pytest.raises(EngineUnavailable) as e:
        pipeline.evaluate(tree, attestations=[], engine=Unreachable(), trust=None, refuse_early=True)
    assert e.value.code == "engine.unreachable"
    assert sum(hashed) < size // 2


def test_a_structurally_sound_refusal_still_comes_from_the_whole_decision(setup):
    """The precheck refuses only on structure: a clean checkpoint without evidence is hashed in
    full and denied by the decision, which names the missing attestation."""
    with pytest.raises(PolicyDenied) as e:
        intake(setup["src"], setup["dst"], attestations=[], options=EngineOptions(trust_file=setup["trust"]))
    assert e.value.evidence["before_digest"] is False
    assert e.value.code == "policy.attestation_missing"


@pytest.mark.parametrize("when", ["on_plan", "on_bytes"])
def test_a_source_opened_for_writing_during_intake_is_not_published(setup, when):
    """The tree holds read leases from the walk to the last byte copied; a writer breaks one,
    before the copy (after the decision and the plan) or during it."""
    from ckptgate.errors import RuntimeFailure

    victim = next(setup["src"].glob("*.safetensors"))
    writers = []

    def open_for_writing(_n):
        if writers:
            return
        writers.append(subprocess.Popen([sys.executable, "-c", "import os, sys; os.open(sys.argv[1], os.O_WRONLY)",
                                         str(victim)]))
        deadline = time.monotonic() + 10
        while "BREAKING" not in Path("/proc/locks").read_text() and time.monotonic() < deadline:
            time.sleep(0.01)  # until the kernel is breaking our lease for the blocked writer

    with pytest.raises(RuntimeFailure) as e:
        intake(setup["src"], setup["dst"], attestations=[setup["attest"]()],
               options=EngineOptions(trust_file=setup["trust"]), max_shard_bytes=700, **{when: open_for_writing})
    assert e.value.code == "runtime.copy.source_changed"
    assert not setup["dst"].exists()
    assert not [p for p in setup["tmp"].iterdir() if "staging" in p.name]
    assert writers[0].wait(timeout=10) == 0  # released when the intake ended


@pytest.mark.parametrize(("fixture", "needs_profile"), [("dcp_torch_save", True), ("hf_sharded", False)])
def test_the_containment_preflight_runs_while_the_digest_hashes(monkeypatch, fixture, needs_profile):
    """Loads beyond pure data get a containment profile, measured beside the digest, not after it."""
    started = threading.Event()
    ran_on: list[str] = []
    seen: dict[str, object] = {}

    def preflight() -> str:
        ran_on.append(threading.current_thread().name)
        started.set()
        return "profile"

    def digest(tree, paths, **_kw):
        if needs_profile:
            assert started.wait(10), "the preflight had not started when hashing began"
        return []

    def judge(inspection, measured, **kw):
        seen.update(kw, digest=measured, loaders=inspection.loaders)
        return "evaluation"

    monkeypatch.setattr(measure, "run_preflight", preflight)
    monkeypatch.setattr(measure, "hash_files", digest)
    monkeypatch.setattr(pipeline, "judge", judge)
    with SafeTree.open(REPO / "tests" / "fixtures" / "data" / fixture / "checkpoint") as tree:
        assert pipeline.evaluate(tree, attestations=[], engine=None, trust=None) == "evaluation"
    assert seen["digest"].manifest == ()  # what the (replaced) hashing returned
    if needs_profile:
        assert "static_pickle" in seen["loaders"]
        assert seen["containment"] == "profile" and ran_on and ran_on[0].startswith("ckptgate-beside-digest")
    else:
        assert seen["containment"] is None and not ran_on


def test_a_plan_the_checkpoint_contradicts_is_a_rejected_input(setup, monkeypatch, capsys):
    """Planning finds inconsistencies of the checkpoint's own layout (a gap, an overlap, padding
    that does not add up): exit 4 like any rejected input, not 1, which promises a bug."""
    from ckptgate._cli import main
    from ckptgate.consolidate.plan import PlanError

    def contradicted(*args, **kwargs):
        raise PlanError("plan.tensor.gap", "w: bytes 4-8 are covered by no chunk")

    monkeypatch.setattr(grouped, "plan_for", contradicted)
    monkeypatch.setattr(onepass, "adapter_plan", contradicted)  # the one pass falls back; the refusal stays
    monkeypatch.setattr(sys, "argv", ["ckptgate", "intake", str(setup["src"]), "--out", str(setup["dst"]),
                                      "--trust", str(setup["trust"]), "--attestation", str(setup["attest"]()), "--json"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == ExitCode.INPUT_REJECTED
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "plan.tensor.gap"
    assert not setup["dst"].exists()


def _swap_offsets(shard: bytes) -> bytes:
    """The same shard with the data offsets of its two 192-byte tensors swapped: same size, same
    header length, each name pointing at the other tensor's bytes."""
    a, b = b'"data_offsets":[0,192]', b'"data_offsets":[192,384]'
    assert shard.count(a) == 1 and shard.count(b) == 1
    return shard.replace(a, b"@A@").replace(b, a).replace(b"@A@", b)


def test_a_file_rewritten_between_inspection_and_digest_is_refused(setup, monkeypatch):
    """Issue 16 F1: a writer keeps a file open (so no lease can be taken), inspection reads a header
    X, and the file is then rewritten in place to the attested Y.  The layout must never come from
    X while the digest and the attestation vouch for Y: the digest's pass finds the inspected
    chunk changed, and nothing is published."""
    from ckptgate.errors import InputRejected

    victim = setup["src"] / "model-00002-of-00003.safetensors"
    y = victim.read_bytes()
    x = _swap_offsets(y)
    assert len(x) == len(y) and x != y
    att = setup["attest"]()  # for Y
    victim.write_bytes(x)  # same inode
    writer = os.open(victim, os.O_WRONLY)
    real = measure.inspect_open_tree

    def inspect_then_rewrite(tree, **kw):
        found = real(tree, **kw)
        os.pwrite(writer, y, 0)
        return found

    monkeypatch.setattr(measure, "inspect_open_tree", inspect_then_rewrite)
    try:
        with pytest.raises(InputRejected) as e:
            intake(setup["src"], setup["dst"], attestations=[att], options=EngineOptions(trust_file=setup["trust"]))
    finally:
        os.close(writer)
    assert e.value.code == "input.walk.changed"
    assert e.value.evidence["path"] == victim.name
    assert not setup["dst"].exists()
    assert not [p for p in setup["tmp"].iterdir() if "staging" in p.name]


def _listing(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_size) for p in root.rglob("*"))


@pytest.mark.parametrize("hook", ["check_destination", "measure", "OnePass.begin", "OnePass.finish",
                                  "write_all"])
def test_swapping_the_parent_of_dst_for_a_symlink_into_the_source_never_writes_inside_it(setup, monkeypatch,
                                                                                          hook):
    """Issue #16, F7: after the destination checks, DST's parent is swapped for a symlink into the
    checkpoint.  The intake either refuses with a typed error or publishes at the original parent;
    nothing is ever written inside the source.  Pure data is written in the digest's pass
    (``OnePass``); a cast takes two passes (``write_all``)."""
    src, parent = setup["src"], setup["tmp"] / "parent"
    parent.mkdir()
    dst = parent / "out"
    before = _listing(src)
    moved = parent.with_name("parent.orig")
    owner, name = (pipeline.OnePass, hook.split(".")[1]) if "." in hook else (grouped, hook)
    real = getattr(owner, name)

    def then_swap(*args, **kwargs):
        result = real(*args, **kwargs)
        parent.rename(moved)
        parent.symlink_to(src, target_is_directory=True)
        return result

    monkeypatch.setattr(owner, name, then_swap)
    extra = {"dtype": "BF16"} if hook == "write_all" else {}
    try:
        intake(src, dst, attestations=[setup["attest"]()], options=EngineOptions(trust_file=setup["trust"]), **extra)
    except UsageError as e:  # resolved after the swap: the parent is proved to be inside the source
        assert hook == "check_destination" and e.code == "usage.dst_inside_source"
        assert not (moved / "out").exists()
    else:
        assert hook != "check_destination"
        assert json.loads((moved / "out" / "ckptgate-receipt.json").read_text())["decision"]["allow"] is True
    assert parent.is_symlink()  # the swap did happen
    assert _listing(src) == before  # nothing published, staged or left inside the source


def test_receipt_containment_is_what_the_worker_measured_not_the_preflight() -> None:
    """The receipt's containment.worker comes from the worker's own measurements; the preflight
    profile the decision saw is kept apart, as a prediction; no worker, no claim."""
    from types import SimpleNamespace

    preflight = {"preflighted": True, "controls": {"seccomp": True, "ipc_ns": True}}
    evaluation = SimpleNamespace(policy_input=SimpleNamespace(containment=preflight))
    measured = {"seccomp": {"status": 2, "mode": "allowlist"}, "no_new_privs": 1,
                "namespaces": {"ipc": {"worker": "ipc:[2]", "parent": "ipc:[1]"}}}
    worker = {"job": "deepspeed", "controls": {"seccomp": True, "ipc_ns": True}, "measured": measured, "wall_s": 1.0}
    done = pipeline.Consolidated(outputs=(), plan_report={"trees_from": "contained_worker", "worker": worker})
    record = outcome._containment_record(evaluation, done)  # type: ignore[arg-type]
    assert record == {"worker": {"job": "deepspeed", "controls": worker["controls"], "measured": measured},
                      "preflight": preflight}
    nothing_ran = pipeline.Consolidated(outputs=(), plan_report={})
    none = outcome._containment_record(evaluation, nothing_ran)  # type: ignore[arg-type]
    assert none == {"worker": None, "preflight": preflight}
