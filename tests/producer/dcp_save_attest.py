"""Run under ``torchrun --nproc_per_node 2``: each rank writes its shard of a tiny sharded model with
``torch.distributed.checkpoint.save``, then calls ``ckptgate.hooks.after_dcp_save``; rank 0 attests.

argv: OUT_DIR KEY BUILDER_ID
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import init_device_mesh

from ckptgate.hooks import after_dcp_save


def main() -> None:
    out, key, builder = sys.argv[1:4]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    dcp.save({"model": model.state_dict()}, checkpoint_id=out)
    done = after_dcp_save(out, key=key, builder_id=builder, step=1)
    assert (done is not None) == (dist.get_rank() == 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
