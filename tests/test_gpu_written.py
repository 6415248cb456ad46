"""GPU-written checkpoints (issue #31, item 6): torch.save storage location records that name a
CUDA device, as a save from that GPU writes them, in an FSDP full state dict, a DCP save with
torch.save storage and a DeepSpeed ZeRO-3 save.

No GPU is available to the project, so these fixtures are synthetic (``meta.json``
``synthetic_device``): written on CPU by the real producers, with ``location_tag`` answering
``cuda:1`` (tests/fixtures/producers/_common.py).  The static reader reads them as data, the
contained worker loads them mapped to the CPU, and what is published equals ground truth and the
CPU-written sibling's ground truth bit for bit; nothing maps them by running the pickle outside the
worker.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import intake
from ckptgate.publish import RECEIPT_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, make_signer  # noqa: E402

pytestmark = pytest.mark.opa

#: synthetic GPU-written fixture -> its CPU-written sibling (same producer, same seed), whose ground
#: truth it equals; None for DeepSpeed, whose two training steps are not bit-reproducible across runs
#: (the order of gloo's bf16 reductions), so only its own ground truth applies.
GPU_WRITTEN = {
    "fsdp_full_cudatag": "fsdp_full",
    "dcp_torch_save_cudatag": "dcp_torch_save",
    "deepspeed_zero3_cudatag": None,
}


def _torch_saves(name: str) -> list[Path]:
    """The files holding torch.save archives: ``.pt``/``.pth``/``.bin`` zips and DCP's ``.distcp``
    (one archive per item).  torch stores ``data.pkl`` uncompressed, so its strings are in the bytes."""
    root = FIXTURES / name / "checkpoint"
    return [p for p in sorted(root.rglob("*")) if p.is_file() and (zipfile.is_zipfile(p) or p.suffix == ".distcp")]


#: The location string ``cpu`` as protocol-2 pickles spell it (SHORT_BINUNICODE, BINUNICODE).
CPU_RECORDS = (b"\x8c\x03cpu", b"X\x03\x00\x00\x00cpu")


@pytest.mark.parametrize("name", sorted(GPU_WRITTEN))
def test_the_location_records_name_the_gpu_as_a_gpu_save_writes_them(name: str) -> None:
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    assert meta["synthetic_device"]["location"] == "cuda:1"  # documented as synthetic
    files = _torch_saves(name)
    assert files
    for f in files:
        raw = f.read_bytes()
        assert b"cuda:1" in raw, f
        assert not any(r in raw for r in CPU_RECORDS), f


def test_torch_load_without_a_map_location_cannot_read_them_on_this_machine() -> None:
    """The records are real device records: torch itself refuses them without a GPU."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    model = FIXTURES / "fsdp_full_cudatag" / "checkpoint" / "model.pt"
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(model, weights_only=True)


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


@pytest.mark.parametrize("name", sorted(GPU_WRITTEN))
def test_a_gpu_written_checkpoint_is_published_bit_exact(name: str, signer: Signer, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from safetensors.torch import load_file

    src = FIXTURES / name / "checkpoint"
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    with SafeTree.open(src) as tree:
        inspection = inspect_open_tree(tree)
    # the static reader reads the GPU records as data (DeepSpeed's own zero_to_*.py scripts are findings
    # the bundled policy excepts by name)
    assert not [f for f in inspection.findings if not f.path.startswith("zero_to_")], inspection.findings
    att = attest(signer, src, tmp_path / "att.json", fmt=str(inspection.format), meta=meta)
    dst = tmp_path / "out"
    intake(src, dst, attestations=[att], options=signer.options)
    assert json.loads((dst / RECEIPT_NAME).read_text())["decision"]["allow"] is True
    got: dict[str, object] = {}
    for f in sorted(dst.glob("*.safetensors")):
        got.update(load_file(str(f)))
    sibling = GPU_WRITTEN[name]
    truths = [FIXTURES / n / "expected.safetensors" for n in (name, sibling) if n]
    for truth in truths:
        want = load_file(str(truth))
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            g = got[k]
            assert g.device.type == "cpu" and g.dtype == v.dtype and g.shape == v.shape, k  # type: ignore[attr-defined]
            assert g.contiguous().view(-1).view(torch_uint8()).numpy().tobytes() == \
                v.contiguous().view(-1).view(torch_uint8()).numpy().tobytes(), k  # type: ignore[attr-defined]


def torch_uint8() -> object:
    import torch

    return torch.uint8
