"""Bench producer: a DeepSpeed ZeRO-3 bf16 checkpoint of about ``size`` bytes of bf16 params.

Run under ``torchrun --nproc_per_node 2`` with ``DS_ACCELERATOR=cpu`` (gloo), as the fixture
producers do (``tests/fixtures/producers/deepspeed_zero.py``, format-notes "DeepSpeed ZeRO"):
``torch.optim.AdamW`` with ``zero_allow_untested_optimizer``, one step, ``engine.save_checkpoint``.
The model is ``layers`` bias-free ``d x d`` linears plus an odd-sized ``head`` (so the last rank's
partition is padded).

    torchrun --standalone --nproc_per_node 2 bench/_zero3_producer.py OUT SIZE_BYTES
"""

from __future__ import annotations

import math
import sys

import deepspeed
import torch
import torch.distributed as dist
from torch import nn


def shape_for(size: int) -> tuple[int, int]:
    """(d, layers) with ``layers * d * d * 2`` close to ``size`` bytes; d at most 4096."""
    params = max(1, size // 2)
    d = min(4096, max(8, int(math.sqrt(params / 8))))
    return d, max(1, round(params / (d * d)))


def main() -> None:
    out, size = sys.argv[1], int(sys.argv[2])
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)
    d, layers = shape_for(size)
    model = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(layers)], nn.Linear(d, 7))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x = torch.randn(1, d, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    loss = engine(x).float().square().mean()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
