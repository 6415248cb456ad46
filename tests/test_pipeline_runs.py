"""What training runs write, taken in end to end through the real embedded OPA (issue 25).

* a ``save_pretrained`` directory (sharded safetensors, config, generation config, tokenizer
  files) is published with its pure-data companions byte-identical;
* a ``Trainer`` ``checkpoint-N`` is allowed: its resume state is inspected, listed in the receipt
  with its digests and pickle inventory, and neither planned nor published;
* a payload in ``training_args.bin`` or ``rng_state.pth`` refuses the intake (exit 4);
* a model state dict named ``optimizer.pt`` is not excluded silently.

The fixtures are written the way the producers write them: ``torch.save`` of the objects, in a
subprocess where stand-in classes are registered in ``sys.modules`` under the real module and
class names (``transformers.training_args.TrainingArguments``, ``accelerate.state.PartialState``)
so the pickles name the real globals. Nothing in them is ever unpickled by the test or the gate.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.demo import demo_statement
from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import InputRejected
from ckptgate.inspect import SafeTree, inspect_tree
from ckptgate.decide.options import EngineOptions
from ckptgate.pipeline import intake
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, KeySigner, generate_keypair, trust_entry
from ckptgate.verify.dsse import sign_statement

# A protobuf ModelProto with one piece {piece: "a", score: 1.0}, as a SentencePiece tokenizer.model is.
TOKENIZER_MODEL = b"\x0a\x08\x0a\x01a\x15\x00\x00\x80\x3f"
COMPANIONS = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4}),
    "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2}),
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}),
    "tokenizer_config.json": json.dumps({"model_max_length": 32}),
    "special_tokens_map.json": json.dumps({"bos_token": "<s>"}),
}

PRODUCER = r'''
import json, os, random, sys, types
import numpy as np
import torch
from safetensors.torch import save_file

out, kind, payload = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out, exist_ok=True)


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def register(module, name, cls):
    """A stand-in class under the real dotted name (its packages are stand-ins too: the real
    transformers and accelerate are never imported)."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    mod = sys.modules[module]
    cls.__module__, cls.__qualname__, cls.__name__ = module, name, name
    setattr(mod, name, cls)
    return cls


torch.manual_seed(0)
weights = {"model.embed.weight": torch.randn(8, 4), "model.norm.weight": torch.ones(4),
           "lm_head.weight": torch.randn(8, 4)}
if kind == "pretrained":
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    wm = {}
    for fn, keys in shards.items():
        save_file({k: weights[k] for k in keys}, os.path.join(out, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in keys})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f)
    sys.exit(0)

# a Trainer checkpoint-N: model.safetensors, config, trainer_state.json and the resume state
save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
with open(os.path.join(out, "trainer_state.json"), "w") as f:
    json.dump({"global_step": 1, "best_model_checkpoint": None, "log_history": []}, f)

Interval = register("transformers.trainer_utils", "IntervalStrategy", type("X", (str,), {}))
Partial = register("accelerate.state", "PartialState", type("X", (), {}))
Args = register("transformers.training_args", "TrainingArguments", type("X", (), {}))
args = Args()
args.output_dir, args.learning_rate, args.save_strategy = "run", 5e-5, Interval("steps")
args.distributed_state = Partial()
if payload == "training_args":
    args.report_to = Payload()
torch.save(args, os.path.join(out, "training_args.bin"))

rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
if payload == "rng_state":
    rng["numpy"] = ("MT19937", Payload())
torch.save(rng, os.path.join(out, "rng_state.pth"))

model = torch.nn.Linear(4, 8)
opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
model(torch.randn(2, 4)).sum().backward()
opt.step()
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
if payload == "model_as_optimizer":
    torch.save(model.state_dict(), os.path.join(out, "optimizer.pt"))
else:
    torch.save(opt.state_dict(), os.path.join(out, "optimizer.pt"))
torch.save(sched.state_dict(), os.path.join(out, "scheduler.pt"))
'''


def produce(out: Path, kind: str, payload: str = "none") -> Path:
    proc = subprocess.run([sys.executable, "-c", PRODUCER, str(out), kind, payload], timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, text in COMPANIONS.items():
        if kind == "pretrained" or name in ("config.json", "generation_config.json"):
            (out / name).write_text(text)
    if kind == "pretrained":
        (out / "tokenizer.model").write_bytes(TOKENIZER_MODEL)
    return out


@pytest.fixture
def gate(tmp_path):
    priv, pub = generate_keypair("ed25519")
    key = tmp_path / "key.pem"
    key.write_bytes(priv)
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps({"signers": [trust_entry(pub, signer_id="test-key",
                                                         predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}))

    def run(src: Path, dst: Path):
        with SafeTree.open(src) as tree:
            digest = fixture_digest(tree).digest.prefixed()
        att = tmp_path / f"att-{digest[7:15]}.json"
        att.write_bytes(sign_statement(demo_statement(Digest.parse(digest), "hf_sharded", producer=("huggingface_hub", "2.4.0")),
                                       KeySigner.from_pem(key)))
        return intake(src, dst, attestations=[att], options=EngineOptions(trust_file=trust))

    return run


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_save_pretrained_directory_is_published_with_its_companions_byte_identical(tmp_path, gate):
    src = produce(tmp_path / "pretrained", "pretrained")
    dst = tmp_path / "out"
    res = gate(src, dst)
    names = [*COMPANIONS, "tokenizer.model"]
    for name in names:
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    receipt = json.loads((dst / "ckptgate-receipt.json").read_text())
    assert sorted(c["file"] for c in receipt["companions"]) == sorted(names)
    assert all(c["sha256"] == sha256(src / c["file"]) for c in receipt["companions"])
    assert sorted(receipt["plan"]["companions"]) == sorted(names)
    assert res.evaluation.decision.companions == tuple(sorted(names))
    assert receipt["resume_state"] == []


def test_a_companion_staged_in_the_one_pass_but_not_named_by_the_decision_is_not_published(tmp_path, gate,
                                                                                            monkeypatch):
    """Pure data is staged while the digest reads it, every checked companion included; only the
    companions the decision names are published."""
    import dataclasses

    from ckptgate import onepass

    real, dropped = onepass.with_companions, []

    def fewer(plan, inspection, decision):
        dropped.append(decision.companions[0])
        return real(plan, inspection, dataclasses.replace(decision, companions=decision.companions[1:]))

    monkeypatch.setattr(onepass, "with_companions", fewer)
    src = produce(tmp_path / "pretrained", "pretrained")
    dst = tmp_path / "out"
    res = gate(src, dst)
    assert res.evaluation.decision.companions[0] == dropped[0]
    published = {p.name for p in dst.iterdir()}
    assert dropped[0] not in published and set(res.evaluation.decision.companions[1:]) <= published
    receipt = json.loads((dst / "ckptgate-receipt.json").read_text())
    assert dropped[0] not in {o["file"] for o in receipt["outputs"]}
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_trainer_checkpoint_is_allowed_with_resume_state_excluded_and_listed(tmp_path, gate):
    src = produce(tmp_path / "checkpoint-1", "trainer")
    dst = tmp_path / "out"
    res = gate(src, dst)
    resume = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"}
    published = {p.name for p in dst.iterdir()}
    assert not resume & published and "trainer_state.json" not in published
    assert {"config.json", "generation_config.json"} <= published
    receipt = json.loads((dst / "ckptgate-receipt.json").read_text())
    listed = {r["path"]: r for r in receipt["resume_state"]}
    assert set(listed) == resume
    assert all(r["sha256"] == sha256(src / p) for p, r in listed.items())
    assert "transformers.training_args.TrainingArguments" in listed["training_args.bin"]["pickle"]["globals"]
    assert "accelerate.state.PartialState" in listed["training_args.bin"]["pickle"]["globals"]
    assert {"numpy.ndarray", "_codecs.encode"} <= set(listed["rng_state.pth"]["pickle"]["globals"])
    assert receipt["plan"].get("companions") == ["config.json", "generation_config.json"]
    codes = {r.code for r in res.evaluation.decision.reasons}
    assert "resume_state_excluded" in codes


@pytest.mark.parametrize("payload", ["training_args", "rng_state"])
def test_a_payload_in_resume_state_refuses_the_intake(tmp_path, gate, payload):
    src = produce(tmp_path / "checkpoint-1", "trainer", payload)
    dst = tmp_path / "out"
    with pytest.raises(InputRejected) as e:
        gate(src, dst)
    assert e.value.code == "input.refused_by_policy" and e.value.exit_code == 4
    assert any(r["code"] == "resume_state_global_not_allowlisted" and r["evidence"]["global"] == "posix.system"
               for r in e.value.reasons), e.value.reasons
    assert not dst.exists()


def test_a_model_named_optimizer_pt_is_not_excluded_silently(tmp_path, gate):
    src = produce(tmp_path / "checkpoint-1", "trainer", "model_as_optimizer")
    found = inspect_tree(src)
    opt = next(f for f in found.files if f.path == "optimizer.pt")
    assert opt.role is None
    assert any(f.code == "resume_state.content_mismatch" and f.path == "optimizer.pt" for f in found.findings)
    dst = tmp_path / "out"
    with pytest.raises(InputRejected) as e:
        gate(src, dst)
    assert e.value.exit_code == 4 and not dst.exists()


def test_a_tokenizer_model_that_is_not_a_tokenizer_does_not_travel(tmp_path):
    src = produce(tmp_path / "pretrained", "pretrained")
    (src / "tokenizer.model").write_bytes(b"\x00\x01 not a protobuf \xff" * 4)
    found = inspect_tree(src)
    assert any(f.code == "companion.content_mismatch" and f.path == "tokenizer.model" for f in found.findings)
    assert not found.clean
