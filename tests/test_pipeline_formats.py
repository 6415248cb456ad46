"""End-to-end intake of every real fixture through the gate: real inspection, a qualification
attestation signed with a throwaway key for the measured digest, the real embedded OPA and
policies, the consolidation plan, the writer and atomic publication.

Published outputs are compared with the producer's ``expected.safetensors`` bit for bit.  Where
the policy refuses a fixture on this host, the test pins the refusal (and that nothing was
published).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptgate.inspect.hashed import HashedFile
from ckptgate.consolidate.plan import NotConsolidatable
from ckptgate.errors import InputRejected
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.inspect.zipcheck import ZipEntry, check_zip
from ckptgate.pipeline import intake
from ckptgate.publish import RECEIPT_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, make_signer  # noqa: E402

pytestmark = pytest.mark.opa

#: fixture -> outcome on this host with the current policy data.
PUBLISHED = ["hf_sharded", "dcp_torch_save", "dcp_torch_save_bytes", "dcp_hf_safetensors", "fsdp_full", "peft_lora",
             "deepspeed_zero2", "deepspeed_zero3", "deepspeed_universal", "megatron_torch_dist"]
REFUSED: dict[str, tuple[type[Exception], str]] = {
    # A rank's shard is a zip stream (BYTE_IO before the safetensors data): inspection refuses it.
    "dcp_hf_safetensors_bytes": (InputRejected, "input.refused_by_policy"),
    # LOCAL_STATE_DICT flat_param: not consolidatable, never guessed.
    "fsdp_local": (InputRejected, "input.refused_by_policy"),
    # The policy allows it (the warning is not an error), the PEFT adapter refuses it [R16].
    "peft_lora_unpinned": (NotConsolidatable, "plan.peft.base_revision_missing"),
}
@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _fmt(src: Path) -> str:
    with SafeTree.open(src) as tree:
        return str(inspect_open_tree(tree).format)


def _run(name: str, signer: Signer, tmp: Path, **kw: Any) -> Any:
    d = FIXTURES / name
    meta = json.loads((d / "meta.json").read_text())
    att = attest(signer, d / "checkpoint", tmp / "att.json", fmt=_fmt(d / "checkpoint"), meta=meta)
    return intake(d / "checkpoint", tmp / "out", attestations=[att], options=signer.options, **kw)


def _tensors(files: list[Path]) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _raw(t: Any) -> bytes:
    return t.contiguous().reshape(-1).view(__import__("torch").uint8).numpy().tobytes()


@pytest.mark.parametrize("name", PUBLISHED)
def test_fixture_is_published_bit_exact(name: str, signer: Signer, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    res = _run(name, signer, tmp_path, max_shard_bytes=400)
    out = tmp_path / "out"
    receipt = json.loads((out / RECEIPT_NAME).read_text())
    assert receipt["decision"]["allow"] is True
    if receipt["decision"]["plane"] == "framework":  # the profile the decision saw is on the record
        assert receipt["containment"]["preflight"]["preflighted"] is True
        assert all(receipt["containment"]["preflight"]["controls"][c] for c in receipt["decision"]["required_controls"])
    if receipt["plan"].get("trees_from") != "contained_worker":  # no worker ran: none is claimed
        assert receipt["containment"]["worker"] is None
    for o in res.outputs:  # every output matches the receipt
        assert hashlib.sha256((out / o.filename).read_bytes()).hexdigest() == o.sha256
    if name.startswith("deepspeed_zero"):  # how the plan was read is on the record
        assert receipt["plan"]["trees_from"] == "static_reader" and "worker" not in receipt["plan"]
    shards = sorted(out.glob("*.safetensors"))
    got = _tensors(shards)
    want = _tensors([FIXTURES / name / "expected.safetensors"])
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert (got[k].dtype, tuple(got[k].shape)) == (v.dtype, tuple(v.shape)), k
        assert _raw(got[k]) == _raw(v), k
    if name.startswith("peft"):
        assert [s.name for s in shards] == ["adapter_model.safetensors"]
        assert (out / "adapter_config.json").read_bytes() == \
            (FIXTURES / name / "checkpoint" / "adapter_config.json").read_bytes()
        assert not (out / "model.safetensors.index.json").exists()
    else:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(want)
        assert {p.name for p in shards} == set(index["weight_map"].values())


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_fixture_is_refused_and_nothing_is_published(name: str, signer: Signer, tmp_path: Path) -> None:
    kind, code = REFUSED[name]
    with pytest.raises(kind) as e:
        _run(name, signer, tmp_path)
    assert e.value.code == code
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["att.json"]  # no staging left behind


def _entries(path: Path) -> tuple[ZipEntry, ...]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return check_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=path.name, verify_crc=False).entries
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["dcp_torch_save", "deepspeed_zero3"])
def test_a_tensor_byte_changed_after_saving_is_refused_even_when_attested(name: str, signer: Signer,
                                                                         tmp_path: Path) -> None:
    """The CRC-32 that inspection leaves to the digest's read still refuses a corrupted storage."""
    src = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / name / "checkpoint", src)
    with SafeTree.open(src) as tree:
        layout = inspect_open_tree(tree).layout
    if "items" in layout:  # DCP: a tensor item past the file's first, so the zip sits at an offset
        item = next(i for i in layout["items"] if i["offset"] > 0 and i.get("kind") == "tensor")
        victim, at = src / item["path"], item["tensor"]["storage_range"][0]
    else:
        victim, at = next((p, e.data_offset) for p in sorted(src.rglob("*.pt"), key=lambda p: -p.stat().st_size)
                          for e in _entries(p) if "/data/" in e.name and e.compressed_size)
    raw = bytearray(victim.read_bytes())
    raw[at] ^= 0x01
    victim.write_bytes(bytes(raw))
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    att = attest(signer, src, tmp_path / "att.json", fmt=_fmt(src), meta=meta)  # signed for these very bytes
    with pytest.raises(InputRejected) as e:
        intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    assert e.value.code == "input.refused_by_policy"
    bad = [f for r in e.value.reasons if r["code"] == "inspection_not_clean"
           for f in r["evidence"]["findings"] if f["code"] == "zip.bad_crc"]
    assert bad == [{"code": "zip.bad_crc", "path": victim.relative_to(src).as_posix()}]
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- kill -9

_CHILD = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from pipeline_helpers import Signer
from ckptgate.pipeline import intake
s = Signer(key_path=Path(sys.argv[2]), trust_file=Path(sys.argv[3]))
print("start", flush=True)
intake(Path(sys.argv[4]), Path(sys.argv[5]), attestations=[Path(sys.argv[6])], options=s.options,
       max_shard_bytes=4 << 20, chunk_size=1 << 16)
print("done", flush=True)
"""


def _big_checkpoint(root: Path) -> Path:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    src = root / "big"
    src.mkdir()
    g = torch.Generator().manual_seed(3)
    save_file({f"w{i}": torch.randn(512, 1024, generator=g) for i in range(12)}, str(src / "model.safetensors"))
    return src


def test_kill_9_at_a_random_point_leaves_dst_absent_or_complete(signer: Signer, tmp_path: Path) -> None:
    src = _big_checkpoint(tmp_path)
    att = attest(signer, src, tmp_path / "att.json", fmt="safetensors", meta={})
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    tmp = tmp_path / "tmp"  # where each killed intake's OPA work directory stays: pytest's, not /tmp
    tmp.mkdir()
    for trial in range(3):
        dst = tmp_path / f"dst{trial}"
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(Path(__file__).resolve().parent),
                                 str(signer.key_path), str(signer.trust_file), str(src), str(dst), str(att)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(tmp)})
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"start"
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = b"done" in proc.stdout.read()
        if dst.exists():
            receipt = json.loads((dst / RECEIPT_NAME).read_text())
            for o in receipt["outputs"]:
                assert hashlib.sha256((dst / o["file"]).read_bytes()).hexdigest() == o["sha256"]
            assert {p.name for p in dst.iterdir()} == {o["file"] for o in receipt["outputs"]} | {RECEIPT_NAME}
        else:
            assert not finished, "the intake returned but published nothing"
        # whatever the kill left is a hidden staging directory beside dst, never a partial dst
        left = {p.name for p in tmp_path.iterdir()} - {"big", "att.json", "tmp"} - {f"dst{i}" for i in range(trial + 1)}
        assert all(re.match(r"\.dst\d\.ckptgate-staging-", n) for n in left), left
    # a later intake to the same place clears what a kill left and publishes
    dst = tmp_path / "dst0"
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).resolve().parent), str(signer.key_path),
                    str(signer.trust_file), str(src), str(dst), str(att)], check=True, capture_output=True, timeout=300)
    assert (dst / RECEIPT_NAME).is_file()
    assert not list(tmp_path.glob(".*.ckptgate-staging-*"))
