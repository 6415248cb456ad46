"""The logits check of a mapping qualification: the published Hugging Face model, loaded by the
pinned transformers with no remote code, run on the fixture's tokens, against the producer's own
forward pass recorded in ``expected.safetensors`` (``logits`` over the padded vocabulary,
``tokens``), over the first ``vocab_size`` columns, in fp32."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.safetensors import read_header

#: The bound of the logits check (max |delta|, fp32) and the name it is signed under in ``checks_run``.
LOGITS_BOUND = 1e-4
LOGITS_CHECK = "logits_parity_1e-4_fp32"


def published_parameters(out_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the safetensors files published in ``out_dir`` (headers only)."""
    out: dict[str, tuple[int, ...]] = {}
    for path in sorted(out_dir.glob("*.safetensors")):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with HashedFile.over(fd, path.name) as src:
                header = read_header(src, os.fstat(fd).st_size, path=path.name)
        finally:
            os.close(fd)
        out.update({t.name: tuple(t.shape) for t in header.tensors})
    return out


def compare_logits(out_dir: Path, expected: Path, vocab_size: int) -> dict[str, Any]:
    """``{max_abs_delta, bound, passed, shape}`` of the model published in ``out_dir``.

    torch and transformers are imported here, not at module top: only a mapping qualification needs
    them, and importing transformers costs seconds of every other command's start-up."""
    import torch  # noqa: PLC0415 - only a mapping qualification runs a forward pass
    from safetensors.torch import load_file  # noqa: PLC0415 - as above
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - as above (seconds of import)

    want = load_file(str(expected))
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), trust_remote_code=False, local_files_only=True)
    model.eval()
    with torch.no_grad():
        got = model(want["tokens"]).logits
    ok_shape = got.shape[-1] == vocab_size and got.dtype == torch.float32
    delta = float((got.float() - want["logits"][..., :vocab_size].float()).abs().max()) if ok_shape else float("inf")
    return {
        "max_abs_delta": delta,
        "bound": LOGITS_BOUND,
        "passed": ok_shape and delta <= LOGITS_BOUND,
        "shape": list(got.shape),
        "dtype": str(got.dtype).removeprefix("torch."),
    }


__all__ = ["LOGITS_BOUND", "LOGITS_CHECK", "compare_logits", "published_parameters"]
