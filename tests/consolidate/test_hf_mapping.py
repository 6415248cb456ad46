"""Megatron Core torch_dist -> Hugging Face through the family table (issue #39).

The fixtures ``megatron_hf_<family>[_<topology>]`` were saved by real megatron-core 0.16.1 (no
Megatron runs here): every family at tp2, Llama and Qwen3 at pp2 (tied Qwen3 embeddings across
stages) and tp2 x pp2, Mixtral and Qwen3-MoE at ep2.  Each holds the checkpoint, the declared
``hf_config/config.json`` and Megatron's own logits on fixed tokens (``expected.safetensors``).  The intake converts, transformers loads the
output with no remote code, and the logits must match within 1e-4 (fp32) over the first
``vocab_size`` columns.  The table's expected names and shapes are checked against what the
pinned transformers' ``save_pretrained`` writes, and every refusal has its typed code.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptgate.consolidate.adapters import dcp
from ckptgate.consolidate.hf import engine as hf_engine
from ckptgate.consolidate.hf import table as hf_table
from ckptgate.consolidate.hf.engine import expected_parameters, map_tensors
from ckptgate.consolidate.hf.plan import layout_ep, layout_tp
from ckptgate.consolidate.hf.source import read_hf_config
from ckptgate.consolidate.hf.table import MappingRefused, declare
from ckptgate.consolidate.plan import OutputTensor, Placement
from ckptgate.errors import Error
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import intake

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline_helpers import FIXTURES, Signer, make_signer, qualification  # noqa: E402

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"]
BOUND = 1e-4
#: fixture suffix -> the topology its attestation states (the producer's own)
TOPOLOGIES: dict[str, dict[str, int]] = {"": {"tp": 2}, "pp2": {"tp": 1, "pp": 2}, "tp2pp2": {"tp": 2, "pp": 2},
                                         "ep2": {"tp": 1, "ep": 2, "dp": 2}}
#: (fixture, family, topology) of every logits fixture: each is a qualified row of policy data
ROWS = [(f"megatron_hf_{f}", f, "") for f in ["llama", "mistral", "qwen2", "qwen3"]] + [
    ("megatron_hf_llama_pp2", "llama", "pp2"), ("megatron_hf_qwen3_pp2", "qwen3", "pp2"),
    ("megatron_hf_mixtral_ep2", "mixtral", "ep2"), ("megatron_hf_qwen3_moe_ep2", "qwen3_moe", "ep2"),
]
ROWS += [(f"megatron_hf_{f}_tp2pp2", f, "tp2pp2") for f in ["llama", "qwen3"]
         if (FIXTURES / f"megatron_hf_{f}_tp2pp2").is_dir()]
_DENSE = {"llama", "mistral", "qwen2", "qwen3"}


def _fixture(name: str) -> Path:
    """``megatron_hf_<name>`` (a family at tp2), or a fixture named in full."""
    return FIXTURES / (name if name.startswith("megatron_hf_") else f"megatron_hf_{name}")


def _config(name: str) -> dict[str, Any]:
    if name == "mixtral":
        name = "mixtral_ep2"
    if name == "qwen3_moe":
        name = "qwen3_moe_ep2"
    return json.loads((_fixture(name) / "hf_config" / "config.json").read_text())


_LAYOUTS: dict[str, Any] = {}


def _layout(family: str) -> Any:
    if family not in _LAYOUTS:
        with SafeTree.open(_fixture(family) / "checkpoint") as tree:
            _LAYOUTS[family] = inspect_open_tree(tree).layout["dcp"]
    return _LAYOUTS[family]


def _map(fixture: str, config: dict[str, Any], *, tensors: list[OutputTensor] | None = None,
         items: list[dict[str, Any]] | None = None) -> tuple[list[OutputTensor], dict[str, Any]]:
    layout = _layout(fixture)
    ts = tensors if tensors is not None else dcp.torch_save_tensors(layout)
    its = items if items is not None else [i for i in layout["items"] if i.get("kind") == "bytes"]
    return map_tensors(ts, its, declare(config))


def _code(fn: Any) -> str:
    with pytest.raises(Error) as e:
        fn()
    return e.value.code


# -- the table against the pinned transformers ------------------------------------------------------
def _saved_by_transformers(config: dict[str, Any], tmp: Path) -> dict[str, tuple[int, ...]]:
    import transformers
    from safetensors import safe_open

    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    cfg.architectures = config["architectures"]
    model = getattr(transformers, config["architectures"][0])(cfg)
    model.save_pretrained(tmp)
    out: dict[str, tuple[int, ...]] = {}
    for f in tmp.glob("*.safetensors"):
        with safe_open(str(f), "np") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[k] = tuple(st.get_slice(k).get_shape())
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_expected_parameters_are_what_transformers_saves(family: str, tied: bool, tmp_path: Path) -> None:
    config = {**_config(family), "tie_word_embeddings": tied}
    assert expected_parameters(declare(config)) == _saved_by_transformers(config, tmp_path)


def test_both_rope_spellings_are_accepted_and_agree() -> None:
    hub = {**_config("llama"), "rope_theta": 500000.0}
    pinned = {k: v for k, v in hub.items() if k != "rope_theta"}
    pinned["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    assert declare(hub).rope_theta == declare(pinned).rope_theta == 500000.0


def test_a_config_written_by_the_pinned_transformers_is_accepted() -> None:
    import transformers

    for family in FAMILIES:
        config = _config(family)
        cls = transformers.AutoConfig.for_model(config["model_type"]).__class__
        written = cls(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")}).to_dict()
        written["architectures"] = config["architectures"]
        assert declare(written).symbols == declare(config).symbols, family


# -- logits parity with Megatron's own forward pass ----------------------------------------------------
@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _attest(signer: Signer, src: Path, out: Path, meta: dict[str, Any], **topology: int) -> Path:
    """A qualification of ``src`` by megatron-core at the fixture's release, stating ``topology``."""
    from ckptgate.digest import fixture_digest
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = qualification(src, digest, fmt="megatron-torch-dist", meta=meta)
    statement["predicate"]["topology"].update({"tp": 2, "pp": 1, "ep": 1, "dp": 1, **topology})
    out.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    return out


def _intake(fixture: str, signer: Signer, tmp: Path, *, topology: dict[str, int] | None = None, **kw: Any) -> Any:
    d = _fixture(fixture)
    meta = json.loads((d / "meta.json").read_text())
    att = _attest(signer, d / "checkpoint", tmp / "att.json", meta, **(topology or {}))
    return intake(d / "checkpoint", tmp / "out", attestations=[att], options=signer.options,
                  hf_config=kw.pop("hf_config", d / "hf_config"), **kw)


def _max_delta(out: Path, fixture: str) -> float:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    want = load_file(str(_fixture(fixture) / "expected.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False)
    model.eval()
    with torch.no_grad():
        got = model(want["tokens"]).logits
    vocab = json.loads((_fixture(fixture) / "hf_config" / "config.json").read_text())["vocab_size"]
    assert got.shape[-1] == vocab and got.dtype == torch.float32
    return float((got - want["logits"][..., :vocab]).abs().max())


MEASURED: dict[str, float] = {}


@pytest.mark.opa
@pytest.mark.parametrize(("fixture", "family", "topo"), ROWS)
def test_mapped_intake_matches_megatron_logits(fixture: str, family: str, topo: str, signer: Signer,
                                               tmp_path: Path) -> None:
    topology = TOPOLOGIES[topo]
    result = _intake(fixture, signer, tmp_path, topology=topology, max_shard_bytes=4000)
    out = tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in names and "config.json" in names
    assert len([n for n in names if n.endswith(".safetensors")]) > 1  # sharded at --max-shard-size
    assert (out / "config.json").read_bytes() == (_fixture(fixture) / "hf_config" / "config.json").read_bytes()
    delta = _max_delta(out, fixture)
    MEASURED[fixture] = delta
    print(f"{fixture}: max|logits delta| = {delta:.3e} (bound {BOUND})")
    assert delta <= BOUND
    plan = result.receipt["plan"]
    assert plan["mapping"] == "hf" and plan["family"] == family and plan["layout_tp"] == topology["tp"]
    assert plan["layout_ep"] == (topology.get("ep") if family not in _DENSE else None)
    assert plan["ledger"]["drops"]["vocab_padding"]["bytes"] > 0
    assert plan["hf_config"]["manifest"][0]["path"] == "config.json"
    hf_input = [i for i in result.receipt["inputs"] if i["role"] == "hf_config"]
    assert hf_input and hf_input[0]["sha256"] == "sha256:" + plan["hf_config"]["sha256"]
    assert [i.role for i in result.evaluation.decision.inputs].count("hf_config") == 1
    facts = result.evaluation.policy_input.to_json()["hf_mapping"]
    assert facts["family"] == family and facts["layout_tp"] == topology["tp"]
    assert facts["config_sha256"] == hf_input[0]["sha256"]
    # the decision names, in words, what the config alone decided (the padding vocab_size drops included)
    said = [r for r in result.evaluation.decision.reasons if r.code == "hf_mapping_declared_not_measured"]
    assert len(said) == 1 and said[0].severity == "info"
    assert "declared, not measured" in said[0].message and hf_input[0]["sha256"] in said[0].message
    assert f"vocab_size ({_config(family)['vocab_size']})" in said[0].message


@pytest.mark.opa
@pytest.mark.parametrize(("fixture", "topology", "code"), [
    ("llama", {"tp": 4}, "hf_mapping_topology_mismatch"),    # the layout shows tp=2
    ("llama", {"pp": 4}, "hf_mapping_not_qualified"),        # a row policy data does not name
    ("llama", {"ep": 2}, "hf_mapping_not_qualified"),
    ("mistral", {"tp": 2, "pp": 2}, "hf_mapping_not_qualified"),  # pp2 is qualified for llama and qwen3 only
    ("mixtral_ep2", {"tp": 1, "ep": 4}, "hf_mapping_topology_mismatch"),  # the layout shows ep=2
    ("mixtral_ep2", {"tp": 1, "ep": 1}, "hf_mapping_topology_mismatch"),
])
def test_an_unqualified_row_is_denied_and_nothing_is_published(fixture: str, topology: dict[str, int], code: str,
                                                               signer: Signer, tmp_path: Path) -> None:
    from ckptgate.errors import PolicyDenied

    with pytest.raises(PolicyDenied) as e:
        _intake(fixture, signer, tmp_path, topology=topology)
    # the producer gate (#31) refuses a topology no qualification names before the mapping's own rows
    # are read; either refusal names the topology, and nothing is published
    text = json.dumps(e.value.to_json())
    assert code in text or e.value.code == "policy.topology_unqualified", text
    assert not (tmp_path / "out").exists()



@pytest.mark.opa
@pytest.mark.parametrize(("topology", "published"), [
    ({"tp": 2, "pp": 1, "ep": 1}, True),  # the qualified row, stated by the job's own provenance (#32)
    ({"tp": 2}, False),                   # pp and ep unknown: denied, never taken for 1
])
def test_training_provenance_states_the_row(topology: dict[str, int], published: bool, tmp_path: Path) -> None:
    from ckptgate.decide.options import EngineOptions
    from ckptgate.errors import PolicyDenied
    from ckptgate.producer.attest import AttestRequest, attest_checkpoint
    from ckptgate.verify import generate_keypair
    from ckptgate.verify.dsse import trust_entry
    from ckptgate.verify.statement import SLSA_PROVENANCE_V1
    from ckptgate.verify.training import CodeRef

    private, public = generate_keypair("ed25519")
    (tmp_path / "k.pem").write_bytes(private)
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps({"signers": [trust_entry(public, signer_id="job", predicate_types=[SLSA_PROVENANCE_V1],
                                                         scopes=["*"], builder_ids=["ci://train"])]}))
    src = _fixture("llama") / "checkpoint"
    attested = attest_checkpoint(AttestRequest(
        src=src, key=tmp_path / "k.pem", out=tmp_path / "att.json", builder_id="ci://train", environment=False,
        producers={"megatron-core": "0.16.1"}, topology=topology, code=CodeRef(uri="git+https://x/y", commit="0" * 40)))
    assert attested.path is not None
    run = lambda: intake(src, tmp_path / "out", attestations=[attested.path],  # noqa: E731
                         options=EngineOptions(trust_file=trust), hf_config=_fixture("llama") / "hf_config")
    if published:
        result = run()
        assert result.receipt["plan"]["mapping"] == "hf" and (tmp_path / "out" / "config.json").exists()
    else:
        with pytest.raises(PolicyDenied) as e:
            run()
        assert "hf_mapping_provenance_unknown" in json.dumps(e.value.to_json())
        assert not (tmp_path / "out").exists()

def test_a_naive_contiguous_qkv_split_fails_the_logits_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one query group a naive q|k|v split happens to be right; at 2 groups it is not, and the
    logits check sees it.  The table is swapped for one that splits linear_qkv contiguously."""
    from ckptgate.consolidate.writer import write_plan
    from ckptgate.consolidate.plan import shard_tensors
    from ckptgate.pipeline import open_sources

    real = hf_table.shared()
    rules = []
    for r in real.rules:
        if r.src == ("decoder.layers.self_attention.linear_qkv.weight",):
            q, k, v = r.parts
            r = dataclasses.replace(r, repeat=None, parts=(
                dataclasses.replace(q, rows=("num_attention_heads", "head_dim")),
                dataclasses.replace(k, rows=("num_key_value_heads", "head_dim")),
                dataclasses.replace(v, rows=("num_key_value_heads", "head_dim"))))
        rules.append(r)
    monkeypatch.setattr(hf_engine, "shared", lambda: dataclasses.replace(real, rules=tuple(rules)))
    out, _ = _map("llama", _config("llama"))
    plan = shard_tensors(out, max_shard_bytes=1 << 30)
    (tmp_path / "out").mkdir()
    with SafeTree.open(_fixture("llama") / "checkpoint") as tree:
        tree.hold()
        with open_sources(tree, plan) as sources:
            write_plan(plan, tmp_path / "out", sources, expected=None)
    shutil.copy(_fixture("llama") / "hf_config" / "config.json", tmp_path / "out" / "config.json")
    assert _max_delta(tmp_path / "out", "llama") > 100 * BOUND


# -- every element accounted for, every shape checked ----------------------------------------------------
def test_the_ledger_covers_every_tensor_and_names_the_drops() -> None:
    out, report = _map("qwen3", _config("qwen3"))
    ledger = report["ledger"]
    assert "output_layer.weight" not in ledger["tensors"]  # tied: Megatron saved none at pp1
    assert ledger["drops"]["vocab_padding"]["bytes"] == 2 * 16 * 4  # rows 30, 31 of the embedding
    assert len(ledger["drops"]["empty_extra_state"]["items"]) == 8
    assert {t.name for t in out} == set(expected_parameters(declare(_config("qwen3"))))


@pytest.mark.parametrize(("change", "code"), [
    ({"num_attention_heads": 8}, "mapping.shape.mismatch"),   # heads
    ({"num_key_value_heads": 4}, "mapping.shape.mismatch"),   # query groups
    ({"head_dim": 8}, "mapping.shape.mismatch"),              # kv channels
    ({"intermediate_size": 32}, "mapping.shape.mismatch"),    # FFN size
    ({"num_hidden_layers": 3}, "mapping.shape.mismatch"),     # layers
    ({"hidden_size": 32}, "mapping.shape.mismatch"),
    ({"vocab_size": 33}, "mapping.vocab.too_few_rows"),
    ({"tie_word_embeddings": True}, "mapping.tied.output_layer_present"),
])
def test_a_config_that_contradicts_the_checkpoint_is_refused(change: dict[str, Any], code: str) -> None:
    with pytest.raises(MappingRefused) as e:
        _map("llama", {**_config("llama"), **change})
    assert e.value.code == code
    if code == "mapping.shape.mismatch":
        assert {"tensor", "expected", "found"} <= set(e.value.evidence)
        assert e.value.evidence["expected"] != e.value.evidence["found"]


def test_untied_config_without_an_output_layer_is_refused() -> None:
    assert _code(lambda: _map("qwen3", {**_config("qwen3"), "tie_word_embeddings": False})) == (
        "mapping.untied.output_layer_missing")


def test_a_missing_hf_parameter_is_refused() -> None:
    config = {**_config("llama"), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    config.pop("rope_theta")
    with pytest.raises(MappingRefused) as e:
        _map("llama", config)  # Qwen2 has q/k/v biases: the llama checkpoint has no linear_qkv.bias
    assert e.value.code == "mapping.source.missing"
    assert "model.layers.{layer}.self_attn.q_proj.bias" in e.value.evidence["hf_parameters"]


def test_an_unmapped_element_is_refused() -> None:
    tensors = dcp.torch_save_tensors(_layout("llama"))
    extra = OutputTensor(name="decoder.layers.self_attention.linear_gate.weight", dtype="F32", shape=(2, 4),
                         placements=(Placement(src="__0_0.distcp", src_offset=0, dst_offset=0, length=32),))
    with pytest.raises(MappingRefused) as e:
        _map("llama", _config("llama"), tensors=[*tensors, extra])
    assert e.value.code == "mapping.source.unmapped"
    assert e.value.evidence["tensor"] == extra.name


def test_a_partly_mapped_tensor_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = hf_table.shared()
    rules = tuple(dataclasses.replace(r, parts=r.parts[:1]) if r.src == ("decoder.layers.mlp.linear_fc1.weight",)
                  else r for r in real.rules)
    monkeypatch.setattr(hf_engine, "shared", lambda: dataclasses.replace(real, rules=rules))
    with pytest.raises(MappingRefused) as e:
        _map("llama", _config("llama"))
    assert e.value.code in ("mapping.shape.mismatch", "mapping.source.unmapped")


def test_non_empty_extra_state_is_refused() -> None:
    items = copy.deepcopy([i for i in _layout("llama")["items"] if i.get("kind") == "bytes"])
    items[0]["empty"] = False  # as an FP8 layer's extra state would be
    assert _code(lambda: _map("llama", _config("llama"), items=items)) == "mapping.extra_state.not_empty"


def test_training_state_is_excluded_and_listed() -> None:
    items = [*(i for i in _layout("llama")["items"] if i.get("kind") == "bytes"),
             {"fqn": "rng_state/shard_0_2", "kind": "bytes", "empty": False}]
    _, report = _map("llama", _config("llama"), items=items)
    assert report["ledger"]["excluded"] == ["rng_state/shard_0_2"]


def test_layout_shows_the_tensor_parallel_split() -> None:
    assert layout_tp(_layout("llama")) == 2
    assert layout_tp(_layout("llama_pp2")) == 1


def test_layout_shows_the_expert_parallel_split() -> None:
    assert layout_ep(_layout("mixtral_ep2")) == 2
    assert layout_ep(_layout("qwen3_moe_ep2")) == 2
    assert layout_ep(_layout("llama")) is None  # no experts


# -- MoE: experts as SequentialMLP saves them, per-expert HF names ---------------------------------------
def test_experts_map_to_per_expert_names() -> None:
    out, report = _map("mixtral_ep2", _config("mixtral"))
    names = {t.name for t in out}
    assert {f"model.layers.1.block_sparse_moe.experts.{e}.{w}.weight" for e in range(4) for w in ("w1", "w2", "w3")
            } <= names
    assert "model.layers.0.block_sparse_moe.gate.weight" in names
    assert "decoder.layers.mlp.experts.experts.linear_fc1.weight" in report["ledger"]["tensors"]
    out, _ = _map("qwen3_moe_ep2", _config("qwen3_moe"))
    names = {t.name for t in out}
    assert {f"model.layers.0.mlp.experts.{e}.{w}.weight" for e in range(4)
            for w in ("gate_proj", "up_proj", "down_proj")} <= names


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_both_expert_count_spellings_are_accepted_and_disagreement_is_refused(family: str) -> None:
    base = {k: v for k, v in _config(family).items() if k not in ("num_experts", "num_local_experts")}
    local, hub = declare({**base, "num_local_experts": 4}), declare({**base, "num_experts": 4})
    assert local.symbols == hub.symbols and local.symbols["num_experts"] == 4
    assert _code(lambda: declare({**base, "num_local_experts": 4, "num_experts": 8})) == "mapping.config.value"
    assert _code(lambda: declare(base)) == "mapping.config.value"


@pytest.mark.parametrize(("family", "change", "code"), [
    ("mixtral", {"num_local_experts": 8}, "mapping.shape.mismatch"),       # experts
    ("qwen3_moe", {"num_experts": 2}, "mapping.shape.mismatch"),
    ("qwen3_moe", {"moe_intermediate_size": 24}, "mapping.shape.mismatch"),  # expert FFN size
    ("mixtral", {"intermediate_size": 12}, "mapping.shape.mismatch"),
])
def test_a_moe_config_that_contradicts_the_checkpoint_is_refused(family: str, change: dict[str, Any],
                                                                 code: str) -> None:
    with pytest.raises(MappingRefused) as e:
        _map(f"{family}_ep2", {**_config(family), **change})
    assert e.value.code == code
    assert e.value.evidence["expected"] != e.value.evidence["found"]


# -- anything outside the table is refused ------------------------------------------------------
@pytest.mark.parametrize(("family", "change", "code"), [
    ("llama", {"hidden_act": "gelu"}, "mapping.config.value"),
    ("llama", {"attention_bias": True}, "mapping.config.value"),
    ("llama", {"mlp_bias": True}, "mapping.config.value"),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "mapping.config.rope"),
    ("qwen3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "mapping.config.rope"),
    ("mistral", {"sliding_window": 4096}, "mapping.config.value"),
    ("qwen2", {"use_sliding_window": True}, "mapping.config.value"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"]}, "mapping.config.value"),
    ("qwen3", {"attention_output_gate": True}, "mapping.config.unknown_key"),
    ("llama", {"rotary_interleaved": True}, "mapping.config.unknown_key"),
    ("llama", {"q_lora_rank": 8}, "mapping.config.unknown_key"),  # MLA
    ("llama", {"architectures": ["GPT2LMHeadModel"]}, "mapping.config.architecture"),
    ("llama", {"architectures": ["LlamaForCausalLM", "MistralForCausalLM"]}, "mapping.config.architecture"),
    ("llama", {"num_key_value_heads": 3}, "mapping.config.value"),
    # numbers no tensor shows ("declared, not measured") must be usable by the forward pass
    ("llama", {"rope_theta": 10**400}, "mapping.config.rope"),  # an int too large for a double: was a traceback
    ("qwen3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10**400}}, "mapping.config.rope"),
    ("llama", {"rms_norm_eps": "1e-6"}, "mapping.config.value"),
    ("llama", {"rms_norm_eps": 0}, "mapping.config.value"),
    ("llama", {"rms_norm_eps": -1e-6}, "mapping.config.value"),
    ("llama", {"rms_norm_eps": True}, "mapping.config.value"),
    ("llama", {"rms_norm_eps": 10**400}, "mapping.config.value"),
    ("qwen3_moe", {"norm_topk_prob": False}, "mapping.config.value"),  # Megatron's top-k softmax renormalises
    ("qwen3_moe", {"mlp_only_layers": [1]}, "mapping.config.value"),   # dense layers among MoE ones
    ("qwen3_moe", {"decoder_sparse_step": 2}, "mapping.config.value"),
    ("mixtral", {"router_jitter_noise": 0.1}, "mapping.config.value"),
    ("mixtral", {"num_experts_per_tok": 5}, "mapping.config.value"),
    ("mixtral", {"sliding_window": 4096}, "mapping.config.value"),
])
def test_outside_the_table_is_refused(family: str, change: dict[str, Any], code: str) -> None:
    assert _code(lambda: declare({**_config(family), **change})) == code


def test_mistral_without_an_explicit_sliding_window_is_refused() -> None:
    config = {k: v for k, v in _config("mistral").items() if k != "sliding_window"}
    assert _code(lambda: declare(config)) == "mapping.config.value"  # MistralConfig's default is 4096


# -- --hf-config: read once, pure data, published byte for byte ------------------------------------------
def test_config_directory_manifest_and_refusals(tmp_path: Path) -> None:
    d = tmp_path / "cfg"
    d.mkdir()
    shutil.copy(_fixture("llama") / "hf_config" / "config.json", d / "config.json")
    (d / "generation_config.json").write_text('{"do_sample": false}')
    (d / "merges.txt").write_text("#version: 0.2\na b\n")
    hf = read_hf_config(d)
    assert [f["path"] for f in hf.manifest] == ["config.json", "generation_config.json", "merges.txt"]
    assert len(hf.digest) == 64
    (d / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["x--tok.T", null]}}')
    assert _code(lambda: read_hf_config(d)) == "hf_config.code_reference"
    (d / "tokenizer_config.json").unlink()
    (d / "modeling_llama.py").write_text("import os\n")
    assert _code(lambda: read_hf_config(d)) == "hf_config.unlisted_file"


@pytest.mark.parametrize("name", ["config.json", "merges.txt", "tokenizer.json"])
def test_a_symlinked_config_entry_is_refused(name: str, tmp_path: Path) -> None:
    """A link's target (any file this user can read) would be published under the entry's name."""
    d = tmp_path / "cfg"
    d.mkdir()
    shutil.copy(_fixture("llama") / "hf_config" / "config.json", d / "config.json")
    target = tmp_path / "outside"
    target.write_bytes((d / name).read_bytes() if name == "config.json" else b'{"secret": "AWS_SECRET=x"}')
    (d / name).unlink(missing_ok=True)
    (d / name).symlink_to(target)
    with pytest.raises(Error) as e:
        read_hf_config(d)
    assert e.value.code == "hf_config.symlink" and e.value.exit_code == 4
    assert e.value.evidence["file"] == name and e.value.evidence["target"] == str(target)



def _tokenizer(vocab: Any, added: list[int]) -> str:
    return json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []},
                       "added_tokens": [{"id": i, "content": f"<t{i}>", "special": True} for i in added]})


@pytest.mark.parametrize(("name", "content", "ok"), [
    ("tokenizer.json", _tokenizer({"a": 0, "b": 27}, [28, 29]), True),   # vocab_size 30: ids 0..29
    ("tokenizer.json", _tokenizer({"a": 0, "b": 27}, [30]), False),      # an added token past the vocabulary
    ("tokenizer.json", _tokenizer({"a": 0, "b": 31}, []), False),        # a token in the padding rows
    ("tokenizer.json", _tokenizer([["a", 0.0]] * 31, []), False),        # Unigram: 31 tokens by position
    ("tokenizer.json", _tokenizer({"a": -1}, []), False),
    ("tokenizer.json", _tokenizer({"a": "7"}, []), False),
    ("vocab.json", json.dumps({"a": 0, "b": 29}), True),
    ("vocab.json", json.dumps({"a": 0, "b": 40}), False),
    ("added_tokens.json", json.dumps({"<x>": 30}), False),
])
def test_the_tokenizer_ids_must_index_published_embedding_rows(name: str, content: str, ok: bool,
                                                               tmp_path: Path) -> None:
    d = tmp_path / "cfg"
    d.mkdir()
    shutil.copy(_fixture("llama") / "hf_config" / "config.json", d / "config.json")  # vocab_size 30, 32 rows
    (d / name).write_text(content)
    if ok:
        assert [f["path"] for f in read_hf_config(d).manifest] == sorted(["config.json", name])
    else:
        with pytest.raises(Error) as e:
            read_hf_config(d)
        assert e.value.code == "hf_config.tokenizer_vocab" and e.value.exit_code == 4
        assert e.value.evidence["file"] == name and e.value.evidence["vocab_size"] == 30

def test_a_config_number_that_overflows_a_double_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    text = json.dumps({**_config("llama"), "rope_theta": 1.0})
    cfg.write_text(text.replace('"rope_theta": 1.0', '"rope_theta": 1e400'))
    assert _code(lambda: read_hf_config(cfg)) == "hf_config.not_json"  # inf by another name: never published


@pytest.mark.opa
def test_refused_intakes_publish_nothing(signer: Signer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_config("llama"), "torch_dtype": "bfloat16"}))
    with pytest.raises(MappingRefused) as e:
        _intake("llama", signer, tmp_path, hf_config=bad)
    assert e.value.code == "mapping.config.dtype" and e.value.exit_code == 4
    assert not (tmp_path / "out").exists()
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps({**_config("llama"), "num_key_value_heads": 4}))
    with pytest.raises(MappingRefused) as e:
        _intake("llama", signer, tmp_path, hf_config=heads)
    assert e.value.code == "mapping.shape.mismatch"
    assert not (tmp_path / "out").exists()



@pytest.mark.opa
def test_the_checkpoint_companions_are_named_not_published_beside_the_config(signer: Signer, tmp_path: Path) -> None:
    """The decision named the checkpoint's own config.json as a companion that travels, while the config's
    was published: what the decision says travels is what is published, and what stays is named."""
    src = tmp_path / "ckpt"
    shutil.copytree(_fixture("llama") / "checkpoint", src)
    (src / "config.json").write_text('{"note": "the checkpoint\'s own"}')
    (src / "generation_config.json").write_text('{"do_sample": true}')
    meta = json.loads((_fixture("llama") / "meta.json").read_text())
    att = _attest(signer, src, tmp_path / "att.json", meta)
    result = intake(src, tmp_path / "out", attestations=[att], options=signer.options,
                    hf_config=_fixture("llama") / "hf_config")
    decision = result.evaluation.decision
    assert decision.companions == ()
    named = {r.evidence["path"] for r in decision.reasons if r.code == "hf_mapping_companion_not_published"}
    assert named == {"config.json", "generation_config.json"}
    assert (tmp_path / "out" / "config.json").read_bytes() == (_fixture("llama") / "hf_config" / "config.json").read_bytes()
    assert not (tmp_path / "out" / "generation_config.json").exists()

def test_cli_hf_config_with_select_is_a_usage_error(tmp_path: Path) -> None:
    from pipeline_helpers import ckptgate_json

    r = ckptgate_json("intake", _fixture("llama") / "checkpoint", "--out", tmp_path / "out",
                      "--hf-config", _fixture("llama") / "hf_config", "--select", "model")
    assert r.returncode == 2, r.stderr
    assert "usage.hf_config.combination" in r.stdout + r.stderr
    assert not (tmp_path / "out").exists()


def test_cli_config_directory_with_code_exits_4_and_publishes_nothing(tmp_path: Path) -> None:
    from pipeline_helpers import ckptgate_json

    cfg = tmp_path / "cfg"
    shutil.copytree(_fixture("llama") / "hf_config", cfg)
    (cfg / "modeling_llama.py").write_text("print('hi')\n")
    r = ckptgate_json("intake", _fixture("llama") / "checkpoint", "--out", tmp_path / "out", "--hf-config", cfg)
    assert r.returncode == 4, r.stderr
    assert "hf_config.unlisted_file" in r.stdout + r.stderr
    assert not (tmp_path / "out").exists()
