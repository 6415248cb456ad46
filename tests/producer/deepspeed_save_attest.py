"""Run under ``torchrun --nproc_per_node 2`` with ``DS_ACCELERATOR=cpu``: a ZeRO-2 engine saves with
``save_checkpoint``, then every rank calls ``ckptgate.hooks.after_deepspeed_save``; rank 0 attests.

argv: OUT_DIR KEY BUILDER_ID
"""

from __future__ import annotations

import sys

import deepspeed
import torch
import torch.distributed as dist

from ckptgate.hooks import after_deepspeed_save


def main() -> None:
    out, key, builder = sys.argv[1:4]
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss = engine(torch.ones(1, 8)).sum()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out)
    done = after_deepspeed_save(engine, out, key=key, builder_id=builder, step=1)
    assert (done is not None) == (dist.get_rank() == 0)
    dist.barrier()


if __name__ == "__main__":
    main()
