"""Megatron-LM ``args`` against the declared config (``consolidate/hf/args.json``), and the mapped
intake of a Megatron-LM-shaped save in both common-state layouts (common.pt; 0.19's BYTE_IO item).

Fixtures: ``megatron_lm_run`` and ``megatron_lm_run_common_item`` (Megatron-LM core_v0.16.1 args,
tp2, with the GPTModel's own logits); ``megatron_hf_llama`` (a bare megatron-core save: no args).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptgate.consolidate.hf.args import DECLARED_NOT_MEASURED, agree, common_args, rows
from ckptgate.consolidate.hf.table import MappingRefused, declare
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import intake

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pipeline_helpers import FIXTURES, Signer, make_signer, qualification  # noqa: E402

RUNS = ["megatron_lm_run", "megatron_lm_run_common_item"]
ITER = "iter_0000010"
BOUND = 1e-4
_LAYOUTS: dict[str, Any] = {}


def _layout(name: str) -> Any:
    if name not in _LAYOUTS:
        root = FIXTURES / name / "checkpoint"
        with SafeTree.open(root / ITER if (root / ITER).is_dir() else root) as tree:
            _LAYOUTS[name] = inspect_open_tree(tree).layout
    return _LAYOUTS[name]


def _config(name: str = "megatron_lm_run") -> dict[str, Any]:
    return json.loads((FIXTURES / name / "hf_config" / "config.json").read_text())


def _agree(args: dict[str, Any] | None, config: dict[str, Any], tp: int | None = 2) -> Any:
    return agree(args, declare(config), config, layout_tp=tp)


@pytest.mark.parametrize("name", RUNS)
def test_the_args_of_a_megatron_lm_save_agree_with_its_config(name: str) -> None:
    args = common_args(_layout(name))
    assert args is not None
    got = _agree(dict(args), _config(name))
    compared = {a["arg"] for a in got.agreed}
    assert {"num_query_groups", "kv_channels", "ffn_hidden_size", "rotary_base", "layernorm_epsilon", "swiglu",
            "untie_embeddings_and_output_weights", "add_qkv_bias", "qk_layernorm", "num_experts", "hidden_size",
            "num_layers", "num_attention_heads", "padded_vocab_size", "tensor_model_parallel_size",
            "normalization"} <= compared
    assert "moe_router_topk" not in compared  # only with experts (num_experts is null here)
    assert got.to_json()["args"] == "present: compared with the config"
    # what the tensors cannot show is now recorded by the producer's own args and agreed
    assert not [n for n in got.not_measured if n.startswith(("rms_norm_eps", "rope_theta", "head_dim", "hidden_act"))]
    assert "norm_epsilon" in got.not_compared  # Megatron-LM 0.16.1 stores --norm-epsilon as layernorm_epsilon


def test_without_args_the_config_is_declared_not_measured() -> None:
    """A bare megatron-core save: nothing to compare, and the words say so."""
    assert common_args(_layout("megatron_hf_llama")) is None
    cfg = json.loads((FIXTURES / "megatron_hf_llama" / "hf_config" / "config.json").read_text())
    got = _agree(None, cfg)
    assert got.to_json()["args"] == f"absent: {DECLARED_NOT_MEASURED}"
    assert got.not_measured and all(n.endswith(": declared, not measured") for n in got.not_measured)
    assert any(n.startswith("head_dim (implicit: 4): how heads split kv_channels") for n in got.not_measured)


@pytest.mark.parametrize(("change", "arg", "key"), [
    ({"rms_norm_eps": 1e-6}, "layernorm_epsilon", "rms_norm_eps"),          # invisible in the tensors
    ({"rope_theta": 500000.0}, "rotary_base", "rope_theta"),                # so is this
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "rotary_base", "rope_theta"),
    ({"num_key_value_heads": 4}, "num_query_groups", "num_key_value_heads"),
    ({"head_dim": 8}, "kv_channels", "head_dim"),
    ({"intermediate_size": 32}, "ffn_hidden_size", "intermediate_size"),
    ({"tie_word_embeddings": True}, "untie_embeddings_and_output_weights", "tie_word_embeddings"),
    ({"hidden_size": 32}, "hidden_size", "hidden_size"),
    ({"num_hidden_layers": 3}, "num_layers", "num_hidden_layers"),
    ({"vocab_size": 40}, "padded_vocab_size", "vocab_size"),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, "add_qkv_bias", "qkv_bias"),
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 4}, "qk_layernorm", "qk_norm"),
])
def test_a_config_that_contradicts_the_args_is_refused_naming_both(change: dict[str, Any], arg: str, key: str) -> None:
    args = common_args(_layout("megatron_lm_run"))
    assert args is not None
    cfg = {**_config(), **change}
    if "rope_parameters" in change:
        del cfg["rope_theta"]
    with pytest.raises(MappingRefused) as e:
        _agree(dict(args), cfg)
    ev = e.value.evidence
    assert e.value.code == "mapping.args.contradicts_config"
    assert (ev["arg"], ev["config_key"]) == (arg, key)
    assert ev["arg_value"] == args[arg] and arg in str(e.value) and key in str(e.value)


@pytest.mark.parametrize(("edit", "code"), [
    ({"normalization": "LayerNorm"}, "mapping.args.outside_table"),
    ({"add_bias_linear": True}, "mapping.args.outside_table"),
    ({"rotary_interleaved": True}, "mapping.args.outside_table"),
    ({"multi_latent_attention": True}, "mapping.args.outside_table"),
    ({"mtp_num_layers": 1}, "mapping.args.outside_table"),
    ({"tensor_model_parallel_size": 4}, "mapping.args.contradicts_config"),   # the layout shows tp=2
    ({"num_experts": 8, "moe_router_topk": 2}, "mapping.args.contradicts_config"),
    ({"swiglu": False}, "mapping.args.contradicts_config"),
    ({"group_query_attention": False}, "mapping.args.contradicts_config"),   # then groups = heads = 4 != 2
    ({"kv_channels": {"not_data": "Call"}}, "mapping.args.unreadable"),
])
def test_args_outside_the_table_are_refused(edit: dict[str, Any], code: str) -> None:
    args = copy.deepcopy(dict(common_args(_layout("megatron_lm_run")) or {}))
    args.update(edit)
    with pytest.raises(MappingRefused) as e:
        _agree(args, _config())
    assert e.value.code == code


def test_a_mixtral_row_compares_experts_and_top_k() -> None:
    """The MoE rows hold when the config says experts (either spelling), checked on the args alone."""
    args = dict(common_args(_layout("megatron_lm_run")) or {})
    args.update({"num_experts": 4, "moe_router_topk": 2})
    from ckptgate.consolidate.hf import args as hf_args

    d = declare(_config())
    for spelling in ("num_local_experts", "num_experts"):
        ok = {**_config(), spelling: 4, "num_experts_per_tok": 2}
        got = hf_args.agree(args, d, ok, layout_tp=2)
        assert {"arg": "moe_router_topk", "value": 2, "config_key": "num_experts_per_tok", "config_value": 2} \
            in got.agreed
        with pytest.raises(MappingRefused) as e:
            hf_args.agree(args, d, {**ok, "num_experts_per_tok": 1}, layout_tp=2)
        assert e.value.evidence["arg"] == "moe_router_topk"


def test_every_row_names_an_argument_a_megatron_lm_save_holds() -> None:
    """The table's names are Megatron-LM's own (a typo would silently compare nothing)."""
    args = common_args(_layout("megatron_lm_run")) or {}
    assert sorted({r.arg for r in rows()} - set(args)) == ["norm_epsilon"]  # the alias newer releases may use


# -- the mapped intake ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _intake(name: str, signer: Signer, tmp: Path, hf_config: Path | None = None) -> Any:
    from ckptgate.digest import fixture_digest
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    d = FIXTURES / name
    src = d / "checkpoint" / ITER
    meta = json.loads((d / "meta.json").read_text())
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = qualification(src, digest, fmt="megatron-torch-dist", meta=meta)
    statement["predicate"]["topology"].update({"tp": 2, "pp": 1, "ep": 1, "dp": 1})
    att = tmp / "att.json"
    att.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    return intake(src, tmp / "out", attestations=[att], options=signer.options, max_shard_bytes=4000,
                  hf_config=hf_config or d / "hf_config")


@pytest.mark.opa
@pytest.mark.parametrize("name", RUNS)
def test_a_megatron_lm_save_is_mapped_in_the_static_plane_and_matches_its_logits(name: str, signer: Signer,
                                                                                 tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    result = _intake(name, signer, tmp_path)
    assert result.evaluation.decision.plane == "static_pickle"
    want = load_file(str(FIXTURES / name / "expected.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=False)
    with torch.no_grad():
        got = model(want["tokens"]).logits
    assert float((got - want["logits"][..., :30]).abs().max()) <= BOUND
    plan = result.receipt["plan"]
    assert plan["megatron_args"]["args"] == "present: compared with the config"
    assert any(a["arg"] == "kv_channels" for a in plan["megatron_args"]["agreed"])
    facts = result.evaluation.policy_input.to_json()["hf_mapping"]
    assert facts["megatron_args"]["args"] == "present: compared with the config"
    assert not [n for n in facts["declared_not_measured"] if n.startswith("rms_norm_eps")]
    if name == "megatron_lm_run_common_item":
        assert "common_state/shard_0_1" in plan["ledger"]["excluded"]
    codes = {r.code for r in result.evaluation.decision.reasons}
    assert "hf_mapping_args_agreed" in codes
    # the args record the padded vocabulary, not the true one: vocab_size alone stays declared
    assert [n.split(" ", 1)[0] for n in facts["declared_not_measured"]] == ["vocab_size"]


@pytest.mark.opa
def test_without_args_the_decision_says_declared_not_measured(signer: Signer, tmp_path: Path) -> None:
    """A bare megatron-core save (no Megatron-LM args): the decision and the receipt say it in words."""
    from ckptgate.digest import fixture_digest
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    d = FIXTURES / "megatron_hf_llama"
    src = d / "checkpoint"
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = qualification(src, digest, fmt="megatron-torch-dist", meta=json.loads((d / "meta.json").read_text()))
    statement["predicate"]["topology"].update({"tp": 2, "pp": 1, "ep": 1, "dp": 1})
    att = tmp_path / "att.json"
    att.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    result = intake(src, tmp_path / "out", attestations=[att], options=signer.options, hf_config=d / "hf_config")
    reasons = {r.code: r for r in result.evaluation.decision.reasons}
    said = reasons["hf_mapping_declared_not_measured"].message
    assert "declared, not measured" in said and "rms_norm_eps" in said and "how heads split kv_channels" in said
    assert result.receipt["plan"]["megatron_args"]["args"] == "absent: declared, not measured"


@pytest.mark.opa
def test_a_config_that_contradicts_the_args_publishes_nothing(signer: Signer, tmp_path: Path) -> None:
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "config.json").write_text(json.dumps({**_config(), "rms_norm_eps": 1e-6}))
    with pytest.raises(MappingRefused) as e:
        _intake("megatron_lm_run", signer, tmp_path, hf_config=cfg_dir)
    assert e.value.code == "mapping.args.contradicts_config"
    assert e.value.evidence["arg"] == "layernorm_epsilon" and e.value.evidence["config_value"] == 1e-6
    assert not (tmp_path / "out").exists()


def test_an_explicit_head_dim_no_tensor_measures_is_declared_not_measured() -> None:
    """2 heads of 8 in one group have the shapes of the saved 4 heads of 4 in two: without q/k norms and
    without args, an explicit head_dim is the config's word, and the words say so."""
    cfg = json.loads((FIXTURES / "megatron_hf_llama" / "hf_config" / "config.json").read_text())
    got = _agree(None, {**cfg, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8})
    assert any(n.startswith("head_dim (explicit: 8): how heads split kv_channels") for n in got.not_measured)
    qwen3 = json.loads((FIXTURES / "megatron_hf_qwen3" / "hf_config" / "config.json").read_text())
    assert "head_dim" in qwen3  # its q/k norms have head_dim entries: measured
    assert not [n for n in _agree(None, qwen3).not_measured if n.startswith("head_dim (explicit")]
