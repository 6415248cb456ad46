"""Benchmark producer: a Llama-shaped megatron-core ``GPTModel`` in bf16 saved with
``dist_checkpointing.save`` (``torch_dist``) at tp2 under ``torchrun --nproc_per_node 2`` on gloo,
no optimizer state, with the Hugging Face ``config.json`` that declares it.

    torchrun --nproc_per_node 2 bench/_megatron_hf_producer.py OUT HIDDEN LAYERS

FFN is 2.75 x hidden (rounded to 64), heads hidden/64 with 4 query groups, vocabulary 32000 (the
same padded by Megatron to a multiple of 128 x tp).  CPU patches as in the fixture producer
(tests/fixtures/producers/megatron_hf_family.py): ``torch.cuda.current_device`` -> "cpu", no-op
``torch.cuda.synchronize``, no-op RNG-tracker fork, local layer spec with ``use_cpu_initialization``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]

import torch.distributed as dist  # noqa: E402

VOCAB = 32000


def main() -> None:
    out, hidden, layers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ffn = (int(hidden * 2.75) + 63) // 64 * 64
    heads, groups = hidden // 64, 4
    dist.init_process_group("gloo")
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    config = TransformerConfig(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_query_groups=groups, use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        normalization="RMSNorm", layernorm_epsilon=1e-5, tensor_model_parallel_size=2,
    )
    padded = (VOCAB + 255) // 256 * 256
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=padded, max_sequence_length=4096, position_embedding_type="rope",
                     rotary_base=10000, share_embeddings_and_output_weights=False)
    model = model.to(torch.bfloat16)  # every weight bf16 (the local spec's norms are created in fp32)
    (out / "checkpoint").mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(out / "checkpoint"))
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "hf_config").mkdir(exist_ok=True)
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
               "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": groups,
               "num_hidden_layers": layers, "vocab_size": VOCAB, "max_position_embeddings": 4096,
               "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 10000.0,
               "torch_dtype": "bfloat16"}
        (out / "hf_config" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
