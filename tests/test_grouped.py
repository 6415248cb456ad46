"""The intake over a group, at a world of one (:class:`~ckptgate.group.LocalGroup`: no torch, no
process group), publishes what the single process publishes: the same output bytes, the same
receipt but for the topology and the times, and the same refusal.  (World 2 and 4 under torchrun:
tests/test_distributed.py.)"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from ckptgate.errors import Error
from ckptgate.group import LocalGroup
from ckptgate.grouped import grouped_intake
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import IntakeResult, intake
from pipeline_helpers import FIXTURES, Signer, attest, make_signer

pytestmark = [pytest.mark.opa]
SHARD = 700  # bytes: several output shards


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _attest(name: str, signer: Signer, tmp: Path) -> Path:
    d = FIXTURES / name
    with SafeTree.open(d / "checkpoint") as tree:
        fmt = str(inspect_open_tree(tree).format)
    return attest(signer, d / "checkpoint", tmp / f"{name}.att.json", fmt=fmt,
                  meta=json.loads((d / "meta.json").read_text()))


def _world_of_one(src: Path, dst: Path, signer: Signer, atts: list[Path]) -> IntakeResult | None:
    with contextlib.ExitStack() as stack:
        return grouped_intake(LocalGroup(), stack, src, dst, attestations=atts, options=signer.options, engine=None,
                              max_shard_bytes=SHARD, signatures=(), key=None, certificate_chain=(),
                              receipt_signer=None)


def _outcome(run: Any) -> tuple[str, Any]:
    try:
        result = run()
    except Error as e:
        return "refused", (e.code, int(e.exit_code), e.evidence.get("refusal"), e.reasons)
    assert result is not None
    return "published", result


def _comparable(receipt: dict[str, Any]) -> dict[str, Any]:
    r = {k: v for k, v in receipt.items() if k not in ("topology", "published_at")}
    r["decision"] = {k: v for k, v in r["decision"].items() if k not in ("id", "engine")}
    return r


# A committed fixture of each plane (pure data, static pickle, framework); a deny, and a refusal
# the single process raises before the digest (the precheck), which the group raises after it.
@pytest.mark.parametrize(("fixture", "attested"), [("hf_sharded", True), ("dcp_hf_safetensors", True),
                                                   ("dcp_torch_save", True), ("deepspeed_zero3", True),
                                                   ("hf_sharded", False), ("fsdp_local", True)])
def test_a_world_of_one_publishes_what_one_process_publishes(fixture: str, attested: bool, signer: Signer,
                                                              tmp_path: Path) -> None:
    src = FIXTURES / fixture / "checkpoint"
    atts = [_attest(fixture, signer, tmp_path)] if attested else []
    one = _outcome(lambda: intake(src, tmp_path / "one", attestations=atts, options=signer.options,
                                  max_shard_bytes=SHARD))
    grouped = _outcome(lambda: _world_of_one(src, tmp_path / "grouped", signer, atts))
    assert one[0] == grouped[0], (one, grouped)
    if one[0] == "refused":
        assert one[1] == grouped[1] and one[1][3], (one, grouped)  # same code, exit code, class and reasons
        assert not (tmp_path / "one").exists() and not (tmp_path / "grouped").exists()
        return
    a, b = one[1], grouped[1]
    assert [o.to_json() for o in a.outputs] == [o.to_json() for o in b.outputs]
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "grouped").iterdir())
    for name in names:
        if name != "ckptgate-receipt.json":
            assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "grouped" / name).read_bytes(), name
    assert _comparable(a.receipt) == _comparable(b.receipt)
    assert b.receipt["topology"]["world_size"] == 1
