"""One rank of a 4-rank job that takes several checkpoints in, one after another, for
tests/test_world_sizes.py; run by torchrun (gloo).  One rendezvous and one torch import per rank
serve two world sizes: every case at a world of 4 over the job's group, then at a world of 2 over
the group of ranks 0 and 1 (ranks 2 and 3 wait).

``argv[1]`` is a JSON file: ``{"4": [case, ...], "2": [case, ...]}``, a case being
``{"src", "dst", "attestations", "trust", "shard"}`` and an optional ``"dtype"``.  Each intake runs through the launch's own
group and steps (:class:`ckptgate.distributed.TorchGroup`, :func:`ckptgate.grouped.grouped_intake`),
rank 0's engine opened once per world; rank 0 writes each outcome to ``argv[2]``-<world>.jsonl:
the receipt, or the error's code, exit code, refusal class and reasons.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ckptgate.decide.options import EngineOptions
from ckptgate.distributed import TorchGroup, _process_group, _secret
from ckptgate.errors import Error
from ckptgate.grouped import EarlyEngine, grouped_intake


class _Sub:
    """torch.distributed as seen from a subgroup: its ranks, its world, its all_gather."""

    def __init__(self, dist: Any, group: Any) -> None:
        self.dist, self.group = dist, group

    def get_rank(self) -> int:
        return int(self.dist.get_rank(self.group))

    def get_world_size(self) -> int:
        return int(self.dist.get_world_size(self.group))

    def all_gather(self, out: Any, mine: Any) -> None:
        self.dist.all_gather(out, mine, group=self.group)


def _run(group: TorchGroup, cases: list[dict[str, Any]], out: Path) -> None:
    group.start()
    outcomes = []
    with contextlib.ExitStack() as shared:
        options = EngineOptions(trust_file=Path(cases[0]["trust"]))
        engine = EarlyEngine(options, shared) if group.rank == 0 else None
        for case in cases:
            try:
                with contextlib.ExitStack() as stack:
                    result = grouped_intake(
                        group, stack, Path(case["src"]), Path(case["dst"]),
                        attestations=[Path(a) for a in case["attestations"]], options=options, engine=engine,
                        max_shard_bytes=case["shard"], signatures=(), key=None, certificate_chain=(),
                        receipt_signer=None, dtype=case.get("dtype"))
                outcomes.append({"published": result.receipt if result is not None else None})
            except Error as e:
                outcomes.append({"refused": [e.code, int(e.exit_code), e.evidence.get("refusal"), list(e.reasons)]})
    if group.rank == 0:
        out.write_text("".join(json.dumps(o, default=str) + "\n" for o in outcomes))


spec = json.loads(Path(sys.argv[1]).read_text())
rank = int(os.environ["RANK"])
with _process_group(120.0) as (torch, dist):
    _run(TorchGroup(dist, torch, _secret()), spec["4"], Path(f"{sys.argv[2]}-4.jsonl"))
    pair = dist.new_group([0, 1])
    if rank < 2:
        _run(TorchGroup(_Sub(dist, pair), torch, _secret()), spec["2"], Path(f"{sys.argv[2]}-2.jsonl"))
    dist.barrier()
