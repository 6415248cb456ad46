"""Run under ``torchrun --nproc_per_node 2``: a tiny Megatron Core ``GPTModel`` at TP=2 is saved with
``dist_checkpointing.save`` (``torch_dist``) into ``SAVE/iter_0000001``, then every rank calls
``ckptgate.hooks.after_dcp_save`` on that iteration folder, as docs/attestations.md's Megatron snippet
says; rank 0 attests.

CPU on gloo: ``torch.cuda.synchronize`` and ``torch.cuda.current_device`` are stubbed (producer-side
patches, as in tests/fixtures/producers/megatron_torch_dist.py); the ``__main__`` guard is required
because the save starts a spawn-based multiprocessing Manager.

argv: SAVE_DIR KEY BUILDER_ID
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]  # CPU: no CUDA
torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]  # used as a tensor device

import torch.distributed as dist  # noqa: E402

from ckptgate.hooks import after_dcp_save  # noqa: E402

TP = 2
ITERATION = 1


def main() -> None:
    save, key, builder = sys.argv[1:4]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, ffn_hidden_size=24, num_attention_heads=2, use_cpu_initialization=True,
        params_dtype=torch.bfloat16, bf16=True, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, tensor_model_parallel_size=TP,
    )
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32,
                     max_sequence_length=8, share_embeddings_and_output_weights=True)
    folder = Path(save) / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        folder.mkdir(parents=True)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(folder))
    done = after_dcp_save(folder, key=key, builder_id=builder, step=ITERATION, topology={"tp": TP})
    assert (done is not None) == (dist.get_rank() == 0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
