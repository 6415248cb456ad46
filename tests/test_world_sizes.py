"""The same intake at a world of 1 (one process: :func:`ckptgate.pipeline.intake`), 2 and 4 ranks
(gloo on one host, under torchrun): the same exit code, refusal code and reasons, the same output
bytes, and the same receipt but for the topology and the times.  One committed fixture per plane,
and the refusals: a deny, the precheck's refusal before the digest, and a bad zip CRC that only
the digest's read finds; and tensor-parallel (strided) placements, which the ranks' writer once
ignored.  The cases of one world size share one job (one rendezvous, one torch
import per rank), to keep the suite's time down."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, make_signer
from test_distributed import SECRET, SHARD, _attest, _comparable, _no_staging

from ckptgate.errors import Error
from ckptgate.pipeline import intake

pytestmark = [pytest.mark.opa, pytest.mark.distributed]
RANK_SCRIPT = Path(__file__).resolve().parent / "world_rank.py"
#: (name, fixture, attested): pure data, static pickle, framework; a deny; the precheck's refusal; a bad CRC;
#: tensor-parallel (strided) placements, each rank writing a share of the outputs.
CASES = [("pure_data", "hf_sharded", True), ("static_pickle", "dcp_torch_save", True),
         ("framework", "deepspeed_zero3", True), ("deny", "hf_sharded", False),
         ("precheck", "fsdp_local", True), ("bad_crc", "fsdp_full", True), ("strided", "megatron_torch_dist", True),
         ("cast", "megatron_torch_dist", True)]
PUBLISHED = ("pure_data", "static_pickle", "framework", "strided", "cast")
#: --dtype: the one writer casts at any world size (strided placements, cast on the way)
CAST = {"cast": "F16"}


def _bad_crc(signer: Signer, tmp: Path) -> tuple[Path, Path]:
    """fsdp_full with one tensor byte of its torch zip flipped (the layout intact, the CRC-32 not),
    attested as it now is: only the digest's read finds it."""
    src = tmp / "bad_crc" / "checkpoint"
    shutil.copytree(FIXTURES / "fsdp_full" / "checkpoint", src)
    path = next(p for p in src.rglob("*") if p.is_file() and zipfile.is_zipfile(p))
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 8)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + 4] ^= 0xFF
    path.write_bytes(bytes(raw))
    return src, attest(signer, src, tmp / "bad_crc.att.json", fmt="fsdp-full",
                       meta=json.loads((FIXTURES / "fsdp_full" / "meta.json").read_text()))


def _outcome(run: Any) -> dict[str, Any]:
    try:
        return {"published": run().receipt}
    except Error as e:
        return json.loads(json.dumps({"refused": [e.code, int(e.exit_code), e.evidence.get("refusal"), list(e.reasons)]},
                                     default=str))


def _worlds(cases: dict[int, list[dict[str, Any]]], tmp: Path) -> dict[int, list[dict[str, Any]]]:
    spec, out = tmp / "cases.json", tmp / "outcomes"
    spec.write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_TEST_")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(RANK_SCRIPT), str(spec), str(out)], capture_output=True, text=True,
                          env={**env, "CKPTGATE_DIST_SECRET": SECRET}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {n: [json.loads(line) for line in Path(f"{out}-{n}.jsonl").read_text().splitlines()] for n in (2, 4)}


def _files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.name != "ckptgate-receipt.json"} \
        if dst.exists() else {}


def test_the_same_intake_at_world_1_2_and_4(tmp_path: Path) -> None:
    signer: Signer = make_signer(tmp_path)
    specs = []
    for name, fixture, attested in CASES:
        src, att = _bad_crc(signer, tmp_path) if name == "bad_crc" else (FIXTURES / fixture / "checkpoint", None)
        atts = [str(att or _attest(fixture, signer, tmp_path))] if attested else []
        specs.append({"name": name, "src": str(src), "attestations": atts, "trust": str(signer.trust_file),
                      "shard": SHARD, "dtype": CAST.get(name)})
    cases = {n: [{**c, "dst": str(tmp_path / f"w{n}" / c["name"])} for c in specs] for n in (1, 2, 4)}
    for n in cases:
        (tmp_path / f"w{n}").mkdir()
    worlds = _worlds({2: cases[2], 4: cases[4]}, tmp_path)
    worlds[1] = [_outcome(lambda c=c: intake(Path(c["src"]), Path(c["dst"]), attestations=c["attestations"],
                                             options=signer.options, max_shard_bytes=SHARD, dtype=c["dtype"]))
                 for c in cases[1]]
    for i, s in enumerate(specs):
        one = worlds[1][i]
        assert ("published" in one) == (s["name"] in PUBLISHED), (s["name"], one)
        for n in (2, 4):
            other = worlds[n][i]
            assert other.keys() == one.keys(), (s["name"], n, one, other)
            if "refused" in one:
                assert other["refused"] == one["refused"] and one["refused"][3], (s["name"], n)
            else:
                assert _comparable(other["published"]) == _comparable(one["published"]), (s["name"], n)
                assert other["published"]["topology"]["world_size"] == n and "topology" not in one["published"]
                shares = [r["outputs_written"] for r in other["published"]["topology"]["ranks"]]
                outputs = [o for o in one["published"]["outputs"] if o["file"] != "model.safetensors.index.json"]
                assert sum(1 for k in shares if k) == min(n, len(outputs)), (s["name"], n, shares)  # split
            assert _files(tmp_path / f"w{n}" / s["name"]) == _files(tmp_path / "w1" / s["name"]), (s["name"], n)
    cast = worlds[1][[s["name"] for s in specs].index("cast")]["published"]
    assert cast["plan"]["cast"]["dtype"] == "F16" and cast["plan"]["cast"]["tensors"] > 0  # cast, the same at every world
    crc = worlds[1][5]["refused"]
    assert crc[1] == 4 and "zip.bad_crc" in json.dumps(crc[3])  # refused for the CRC the digest's read found
    for n in (1, 2, 4):
        _no_staging(tmp_path / f"w{n}")
