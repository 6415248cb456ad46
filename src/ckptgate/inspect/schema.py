"""The JSON Schema of :meth:`Inspection.to_facts` (the ``inspection`` object of the OPA input).

Stable: fields are only ever added.  ``layout`` is per format (docs/inspect.md) and left open.
"""

from __future__ import annotations

from typing import Any

import jsonschema

__all__ = ["FACTS_SCHEMA", "validate_facts"]

_CODE = r"^[a-z0-9_]+(\.[a-z0-9_]+)+$"

FACTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://ckptgate.invalid/schemas/inspection-facts-1.json",
    "type": "object",
    "required": ["format", "clean", "consolidatable", "loaders", "findings", "files", "pickles", "layout"],
    "additionalProperties": False,
    "properties": {
        "format": {
            "enum": [
                "hf-sharded-safetensors",
                "safetensors",
                "peft-lora",
                "peft",
                "dcp-torch-save",
                "dcp-hf-safetensors",
                "fsdp-full",
                "fsdp-local",
                "megatron-torch-dist",
                "deepspeed-zero2",
                "deepspeed-zero3",
                "deepspeed-universal",
                "unknown",
            ]
        },
        "clean": {"type": "boolean"},
        "consolidatable": {"type": "boolean"},
        "loaders": {
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": ["safetensors", "json", "static_pickle", "torch_load", "deepspeed"]},
        },
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["code", "severity", "path", "message", "evidence"],
                "properties": {
                    "code": {"type": "string", "pattern": _CODE},
                    "severity": {"enum": ["error", "warning", "info"]},
                    "path": {"type": "string"},
                    "message": {"type": "string"},
                    "evidence": {"type": "object"},
                },
            },
        },
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "kind", "size", "detail"],
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "kind": {
                        "enum": [
                            "safetensors",
                            "json",
                            "text",
                            "torch_zip",
                            "torchscript",
                            "legacy_torch",
                            "pickle",
                            "numpy",
                            "npz",
                            "zip_stream",
                            "code",
                            "archive",
                            "empty",
                            "unknown",
                        ]
                    },
                    "size": {"type": "integer", "minimum": 0},
                    "detail": {"type": "string"},
                    "role": {"enum": ["companion", "resume_state"]},
                },
            },
        },
        "pickles": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": [
                    "context",
                    "protocol",
                    "complete",
                    "opcodes",
                    "globals",
                    "calls",
                    "inside_allowlist",
                    "plain_tensors",
                ],
                "properties": {
                    "context": {"type": "string"},
                    "complete": {"type": "boolean"},
                    "protocol": {"type": ["integer", "null"]},
                    "globals": {"type": "array", "items": {"type": "string"}},
                    "inside_allowlist": {"type": "boolean"},
                    "plain_tensors": {"type": "boolean"},
                },
            },
        },
        "layout": {"type": "object"},
        "topology": {
            "type": "object",
            "additionalProperties": False,
            "patternProperties": {"^(tp|pp|dp|ep|etp|cp|world_size|zero_stage|fsdp_mode)$": {"type": "array"}},
        },
    },
}


def validate_facts(doc: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` follows the facts schema."""
    jsonschema.validate(doc, FACTS_SCHEMA, cls=jsonschema.Draft202012Validator)
