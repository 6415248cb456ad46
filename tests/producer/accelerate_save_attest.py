"""``Accelerator.save_state`` then ``ckptgate.hooks.after_accelerate_save`` (one CPU process).

argv: OUT_DIR KEY BUILDER_ID
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator

from ckptgate.hooks import after_accelerate_save


def main() -> None:
    out, key, builder = sys.argv[1:4]
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    accelerator.save_state(out)
    done = after_accelerate_save(accelerator, out, key=key, builder_id=builder, step=1)
    assert done is not None and done.path is not None and done.path.is_file()


if __name__ == "__main__":
    main()
