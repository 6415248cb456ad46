"""FSDP state dicts saved with ``torch.save``: full (plain tensors) or local flat-param shards [R03].

SHARDED_STATE_DICT goes through DCP and is detected there.  A LOCAL_STATE_DICT holds
``<prefix>_flat_param`` shards with no per-parameter names or shapes: not consolidatable.
"""

from __future__ import annotations

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.registry import register_detector

__all__ = ["detect_fsdp"]


def detect_fsdp(ctx: Context) -> FormatResult | None:
    zips = {p: f for p, f in ctx.files.items() if f.kind == FileKind.TORCH_ZIP}
    if not zips or any(f.kind in (FileKind.SAFETENSORS,) for f in ctx.files.values()):
        return None
    findings: list[Finding] = []
    local = sorted(
        p
        for p, f in zips.items()
        if f.torch is not None
        and any(k.endswith("flat_param") for k in [t.name for t in f.torch.tensors] + list(f.torch.values))
    )
    if local:
        findings.append(
            warning(
                "fsdp.local_not_consolidatable",
                local[0],
                "LOCAL_STATE_DICT flat-param shards "
                "carry no per-parameter names or shapes; they cannot be consolidated",
                files=local,
            )
        )
        layout = {"files": local, "consolidatable": False}
        return FormatResult(
            format="fsdp-local", layout=layout, loaders=("torch_load",), findings=tuple(findings), consolidatable=False
        )
    if len(zips) != 1:
        return None
    p, f = next(iter(zips.items()))
    if f.torch is None or f.pickle is None:
        findings.append(error("fsdp.unreadable", p, "the torch zip could not be read statically"))
        return FormatResult(
            format="fsdp-full",
            layout={"file": p},
            loaders=("torch_load",),
            findings=tuple(findings),
            consolidatable=False,
        )
    plain = f.pickle.plain_tensors
    return FormatResult(
        format="fsdp-full",
        layout={"file": p, **f.torch.to_json()},
        loaders=("static_pickle",) if plain else ("torch_load",),
        findings=tuple(findings),
    )


register_detector("fsdp", detect_fsdp, formats=("fsdp-full", "fsdp-local"), order=80)
