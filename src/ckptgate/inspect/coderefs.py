"""Code references in JSON companions: what transformers' dynamic-module loader would import.

``transformers`` runs code named by a checkpoint's own files when a user passes
``trust_remote_code=True``: every such path goes through ``get_class_from_dynamic_module`` (or
``get_cached_module_file``) in ``transformers/dynamic_module_utils.py``.  :data:`CALL_SITES` lists
every caller in the transformers release pinned in ``pins.toml`` (``[reference] transformers``),
found by reading its source, with the companion keys each one reads a reference from.
``tests/inspect/test_coderefs.py`` reads the installed source again and fails when a caller
appears that this table does not name, or when a row names a caller that is gone.

The scan refuses, in every JSON file of the checkpoint (companions that travel included), at any
depth (nested sub-configs such as ``text_config`` are read by the same loaders):

* ``config.auto_map``: an ``auto_map`` key whose value holds a string (a class reference);
* ``config.custom_pipelines``: a ``custom_pipelines`` key whose value holds a string (its ``impl``);
* ``config.dynamic_module_ref``: any other string value in the ``repo--module.Class`` form that
  ``get_class_from_dynamic_module`` splits on ``--``.

These findings are code-bearing: policy data lists them (``code_bearing_findings``) and no finding
exception applies to them.  A ``.py`` file (``custom_generate/generate.py`` included) is
``classify.code`` already.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.findings import Finding, error

__all__ = ["CALL_SITES", "CODE_KEYS", "CallSite", "code_reference_findings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSite:
    """One caller of transformers' dynamic-module loader and the companion keys it reads."""

    path: str  #: relative to the transformers package
    function: str  #: qualified name of the enclosing function
    loader: str  #: get_class_from_dynamic_module or get_cached_module_file
    keys: tuple[str, ...]  #: companion keys that carry the reference ("" for a code file)
    reads: str  #: where the reference comes from, as the source reads it


_G = "get_class_from_dynamic_module"
_C = "get_cached_module_file"

#: Every caller in transformers 5.24.0 (``[reference] transformers`` in pins.toml).
CALL_SITES: tuple[CallSite, ...] = (
    CallSite(
        path="models/auto/auto_factory.py",
        function="_BaseAutoModelClass.from_config",
        loader=_G,
        keys=("auto_map",),
        reads="config.auto_map[<AutoModel class>] of a config object, sub-configs included",
    ),
    CallSite(
        path="models/auto/auto_factory.py",
        function="_BaseAutoModelClass.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="config.json auto_map[<AutoModel class>]",
    ),
    CallSite(
        path="models/auto/configuration_auto.py",
        function="AutoConfig.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="config.json auto_map['AutoConfig']",
    ),
    CallSite(
        path="models/auto/tokenization_auto.py",
        function="AutoTokenizer.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="tokenizer_config.json auto_map['AutoTokenizer'] (a [slow, fast] pair), else config.json's",
    ),
    CallSite(
        path="models/auto/processing_auto.py",
        function="AutoProcessor.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="auto_map['AutoProcessor'] of processor_config.json, preprocessor_config.json, "
        "video_preprocessor_config.json, tokenizer_config.json or config.json",
    ),
    CallSite(
        path="models/auto/feature_extraction_auto.py",
        function="AutoFeatureExtractor.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="preprocessor_config.json auto_map['AutoFeatureExtractor'], else config.json's",
    ),
    CallSite(
        path="models/auto/image_processing_auto.py",
        function="AutoImageProcessor.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="preprocessor_config.json (or config.json) auto_map['AutoImageProcessor'], a dict or list by backend",
    ),
    CallSite(
        path="models/auto/video_processing_auto.py",
        function="AutoVideoProcessor.from_pretrained",
        loader=_G,
        keys=("auto_map",),
        reads="auto_map['AutoVideoProcessor'] (or AutoImageProcessor renamed) of the video/preprocessor config "
        "or config.json",
    ),
    CallSite(
        path="pipelines/__init__.py",
        function="pipeline",
        loader=_G,
        keys=("custom_pipelines",),
        reads="config.json custom_pipelines[<task>]['impl']",
    ),
    CallSite(
        path="dynamic_module_utils.py",
        function="get_class_from_dynamic_module",
        loader=_C,
        keys=(),
        reads="the module file of the reference it was given (the '--' form names another repository)",
    ),
    CallSite(
        path="dynamic_module_utils.py",
        function="get_cached_module_file",
        loader=_C,
        keys=(),
        reads="each relative import of a module file it fetched",
    ),
    CallSite(
        path="generation/utils.py",
        function="GenerationMixin.load_custom_generate",
        loader=_C,
        keys=(),
        reads="the file custom_generate/generate.py of the checkpoint (a code file: classify.code)",
    ),
)

#: Companion keys whose value names code for the dynamic-module loader, and their finding codes.
CODE_KEYS: dict[str, str] = {
    "auto_map": "config.auto_map",
    "custom_pipelines": "config.custom_pipelines",
}
assert {k for s in CALL_SITES for k in s.keys} == set(CODE_KEYS)

#: ``repo--module.Class`` as get_class_from_dynamic_module splits it: ``repo_id, class_reference =
#: class_reference.split("--")`` (so exactly one ``--``), then ``module_file, class_name =
#: class_reference.split(".")`` (so exactly one dot after it); the module file may name a subfolder.
_DYNAMIC_REF = re.compile(r"(?:(?!--)[\w.\-/])+--(?:(?!--)[\w\-/])+\.[A-Za-z_]\w*", re.ASCII)
_MAX_REPORTED = 20


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _walk(doc: Any) -> Iterator[tuple[str, str | None, Any]]:
    """``(json pointer, key, value)`` of every value in ``doc``; key is None inside a list."""
    stack: list[tuple[str, str | None, Any]] = [("", None, doc)]
    while stack:
        ptr, key, v = stack.pop()
        yield ptr, key, v
        if isinstance(v, dict):
            stack.extend((f"{ptr}/{_escape(k)}", k, x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((f"{ptr}/{i}", None, x) for i, x in reversed(list(enumerate(v))))


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def code_reference_findings(path: str, doc: Any) -> list[Finding]:
    """Error findings for every code reference in the parsed JSON ``doc`` of ``path``."""
    found: list[Finding] = []
    inside: list[str] = []  # pointers already reported by key: a reference within is not reported twice
    for ptr, key, value in _walk(doc):
        if len(found) >= _MAX_REPORTED:
            break
        if key in CODE_KEYS and any(True for _ in _strings(value)):
            inside.append(ptr + "/")
            found.append(
                error(
                    CODE_KEYS[key],
                    path,
                    f"{key} at {ptr} names custom code for transformers' dynamic-module loader; "
                    "it is refused and never run",
                    pointer=ptr,
                    value=str(value)[:200],
                )
            )
        elif isinstance(value, str) and _DYNAMIC_REF.fullmatch(value) and not any(ptr.startswith(i) for i in inside):
            found.append(
                error(
                    "config.dynamic_module_ref",
                    path,
                    f"the string at {ptr or '/'} is a remote-code reference (repo--module.Class); "
                    "it is refused and never run",
                    pointer=ptr,
                    value=value[:200],
                )
            )
    return found
