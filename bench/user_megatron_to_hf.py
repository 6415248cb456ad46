"""The path a user scripts today to turn a Megatron Core ``torch_dist`` checkpoint into a Hugging
Face model, spelled out as the benchmark's peer (bench/bench_hf_mapping.py):

1. ``dcp_to_torch_save`` to one ``.pt`` file (every tensor gathered in memory);
2. ``torch.load`` it;
3. rename and split by the same family table as ckptgate (``families.json``: the grouped q|k|v
   rows, ``[gate; up]``, vocabulary padding dropped), in torch;
4. ``safetensors.torch.save_file`` in shards of 2 GiB, with ``model.safetensors.index.json``;
5. ``sync``.

    python bench/user_megatron_to_hf.py SRC DST HF_CONFIG_DIR
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckptgate.consolidate.hf.table import declare, shared

SHARD = 2 << 30


def main() -> None:
    src, dst, cfg_dir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    dst.mkdir()
    pt = dst / "consolidated.pt"
    dcp_to_torch_save(str(src), str(pt))
    sd = torch.load(str(pt), weights_only=False, mmap=True)  # the Megatron save holds BytesIO extra state
    config = json.loads((cfg_dir / "config.json").read_text())
    d = declare(config)
    s = d.symbols
    out: dict[str, torch.Tensor] = {}
    for rule in shared().rules:
        if any(d.facts.get(k) != v for k, v in rule.when.items()):
            continue
        name = next(n for n in rule.src if n in sd)
        t = sd[name]
        layers = list(range(s["num_hidden_layers"])) if rule.layers else [None]
        reps = s[rule.repeat] if rule.repeat else 1
        sizes = [math.prod(s[r] for r in p.rows) for p in rule.parts]
        for layer in layers:
            x = t[layer] if layer is not None else t
            x = x[: reps * sum(sizes)].reshape(reps, sum(sizes), *x.shape[1:])
            for p, part in zip(rule.parts, torch.split(x, sizes, dim=1), strict=True):
                dst_name = p.dst.format(layer=layer) if layer is not None else p.dst
                out[dst_name] = part.reshape(-1, *x.shape[2:]).contiguous()
    del sd
    pt.unlink()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in out.items():
        n = v.numel() * v.element_size()
        if shards[-1] and size + n > SHARD:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += n
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(dst / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(v.numel() * v.element_size() for v in out.values())
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (dst / "config.json").write_bytes((cfg_dir / "config.json").read_bytes())
    os.sync()
    print(json.dumps({"tensors": len(out)}))


if __name__ == "__main__":
    main()
