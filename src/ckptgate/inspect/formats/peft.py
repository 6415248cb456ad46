"""PEFT adapters: ``adapter_config.json`` + ``adapter_model.safetensors`` (or ``.bin``) [R16]."""

from __future__ import annotations

import json
import re
from typing import Any

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.registry import register_detector

__all__ = ["detect_peft", "pins_a_commit"]

_FIELDS = (
    "base_model_name_or_path",
    "revision",
    "peft_type",
    "task_type",
    "peft_version",
    "r",
    "lora_alpha",
    "target_modules",
    "modules_to_save",
)
_MAX_STRING = 4096  # a hub id is at most 96 characters, a local path at most PATH_MAX
_MAX_FIELD = 64 << 10  # JSON-encoded: a long explicit target_modules list fits
#: a full commit id (SHA-1, or SHA-256 for a repository that uses it): a branch or tag name moves
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def pins_a_commit(revision: object) -> bool:
    """Whether an adapter's ``revision`` names one commit of its base (a branch or a tag can move)."""
    return isinstance(revision, str) and _COMMIT.fullmatch(revision) is not None


def _too_long(value: object) -> bool:
    if isinstance(value, str):
        return len(value) > _MAX_STRING
    return len(json.dumps(value)) > _MAX_FIELD


def detect_peft(ctx: Context) -> FormatResult | None:
    configs = sorted(p for p in ctx.files if p.rsplit("/", 1)[-1] == "adapter_config.json")
    if not configs:
        return None
    findings: list[Finding] = []
    adapters = []
    loaders = {"json"}
    for cp in configs:
        folder = cp.rsplit("/", 1)[0] if "/" in cp else ""
        doc = ctx.files[cp].json
        if not isinstance(doc, dict):
            findings.append(error("peft.config_invalid", cp, "adapter_config.json is not a JSON object"))
            continue
        fields = {k: doc.get(k) for k in _FIELDS if k in doc}
        for k in [k for k, v in fields.items() if _too_long(v)]:  # kept out of the facts, the policy input
            findings.append(
                error(
                    "peft.field_too_long",
                    cp,
                    f"adapter_config.json field {k!r} is implausibly long",
                    field=k,
                    limit=_MAX_STRING if isinstance(fields[k], str) else _MAX_FIELD,
                )
            )
            fields[k] = None
        if not isinstance(doc.get("base_model_name_or_path"), str) or not doc["base_model_name_or_path"]:
            findings.append(error("peft.base_model_missing", cp, "adapter_config.json names no base model"))
        if not pins_a_commit(doc.get("revision")):
            findings.append(
                warning(
                    "peft.base_not_pinned",
                    cp,
                    "the base model revision is not a commit id (null, or a branch or tag name that can "
                    "move): the base is not pinned [R16]",
                    base=fields.get("base_model_name_or_path"),
                    revision=fields.get("revision"),
                )
            )
        pre = f"{folder}/" if folder else ""
        weights = None
        for name in ("adapter_model.safetensors", "adapter_model.bin"):
            f = ctx.files.get(pre + name)
            if f is not None:
                weights = f
                break
        entry: dict[str, Any] = {"config": cp, "fields": fields, "weights": None}
        if weights is None:
            findings.append(
                error("peft.weights_missing", cp, "no adapter_model.safetensors or .bin next to the config")
            )
        else:
            entry["weights"] = weights.path
            if weights.kind == FileKind.SAFETENSORS and weights.safetensors is not None:
                loaders.add("safetensors")
                entry["tensors"] = [t.to_json() for t in weights.safetensors.tensors]
            elif weights.kind == FileKind.TORCH_ZIP and weights.torch is not None:
                plain = weights.pickle is not None and weights.pickle.plain_tensors
                loaders.add("static_pickle" if plain else "torch_load")
                entry["tensors"] = [t.to_json() for t in weights.torch.tensors]
            else:
                findings.append(
                    error(
                        "peft.weights_unreadable",
                        weights.path,
                        "adapter weights are not a valid safetensors file or torch zip",
                    )
                )
        adapters.append(entry)
    peft_types = {a["fields"].get("peft_type") for a in adapters}
    fmt = "peft-lora" if peft_types == {"LORA"} else "peft"
    return FormatResult(
        format=fmt, layout={"adapters": adapters}, loaders=tuple(sorted(loaders)), findings=tuple(findings)
    )


register_detector("peft", detect_peft, formats=("peft", "peft-lora"), order=20)
