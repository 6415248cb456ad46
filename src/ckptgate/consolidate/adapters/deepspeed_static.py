"""The JSON trees a ZeRO plan needs, built from the static reader's symbolic values of the state
files, when every one of them stayed inside the static reader's DeepSpeed allowlist: nothing is
imported or called, and no worker starts [R10]."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptgate.errors import RuntimeFailure
from ckptgate.inspect.pickle import Call, Global, SDict, SList, SSet, key_text

#: Classes a ZeRO pickle rebuilds as ``REDUCE(cls, (value,))`` that are enums [R10].
_ENUMS = frozenset({"deepspeed.runtime.zero.config.ZeroStageEnum"})
_MAX_NODES = 5_000_000
_MAX_DEPTH = 200


def statically_readable(files: Mapping[str, Any], rels: Sequence[str]) -> bool:
    """Whether every file in ``rels`` is a torch zip whose pickle the static reader read completely
    inside its allowlist."""
    return all(
        (f := files.get(rel)) is not None
        and f.torch is not None
        and f.pickle is not None
        and f.pickle.complete
        and f.pickle.inside_allowlist
        and f.pickle.value is not None
        for rel in rels
    )


def static_trees(files: Mapping[str, Any], rels: Sequence[str]) -> dict[str, Any]:
    """The worker's JSON trees for ``rels``, built from the static reader's symbolic values.

    Tensors become ``__tensor__`` records from the statically read torch-zip layout; an
    OrderedDict becomes a dict, ``torch.Size`` a list, a known enum ``{"__enum__", "value"}``, and
    any other call ``{"__object__", "state"}`` (its arguments are never interpreted).
    """
    out: dict[str, Any] = {}
    for rel in rels:
        if not statically_readable(files, [rel]):
            raise RuntimeFailure(
                "runtime.plan.not_static",
                f"{rel} was not read statically inside the allowlist, "
                "so no plan can be built from it without a framework load",
                evidence={"path": rel},
            )
        f = files[rel]
        tensors = {t.name: t for t in f.torch.tensors}
        # the reader measured (and charged) the value as a tree before keeping it: no walk exceeds that
        out[rel] = _json(f.pickle.value, "", tensors, [min(_MAX_NODES, f.pickle.tree_units)], 0, rel)
    return out


def _json(v: Any, path: str, tensors: Mapping[str, Any], budget: list[int], depth: int, rel: str) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        raise RuntimeFailure(
            "runtime.plan.too_large",
            f"{rel}: the pickle's object tree is too large or too deep to plan from",
            evidence={"path": rel},
        )

    def sub(k: Any, x: Any) -> Any:
        key = key_text(k)
        return _json(x, f"{path}.{key}" if path else key, tensors, budget, depth + 1, rel)

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return {"__bytes__": None, "len": len(v)}
    if isinstance(v, tuple):
        return [sub(i, x) for i, x in enumerate(v)]
    if isinstance(v, SList):
        return [sub(i, x) for i, x in enumerate(v.items)]
    if isinstance(v, SSet):
        return {"__set__": [sub(i, x) for i, x in enumerate(v.items)]}
    if isinstance(v, SDict) or (
        isinstance(v, Call)
        and (
            v.dict_items is not None
            or (isinstance(v.func, Global) and v.func.dotted == "collections.OrderedDict" and not v.args)
        )
    ):
        items = v.items if isinstance(v, SDict) else v.dict_items or []
        if all(isinstance(k, str) for k, _ in items):
            return {k: sub(k, x) for k, x in items}
        return {"__map__": [[sub(i, k), sub(k, x)] for i, (k, x) in enumerate(items)]}
    if isinstance(v, Call):
        if path in tensors:
            t = tensors[path]
            return {
                "__tensor__": {
                    "storage_key": t.storage_key,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "stride": list(t.stride),
                    "storage_offset": t.storage_offset,
                    "storage_nbytes": t.storage_nbytes,
                }
            }
        func = v.func.dotted if isinstance(v.func, Global) else "?"
        if func == "torch.Size" and isinstance(v.args, tuple) and len(v.args) == 1 and isinstance(v.args[0], tuple):
            return [sub(i, x) for i, x in enumerate(v.args[0])]
        if func in _ENUMS and isinstance(v.args, tuple) and len(v.args) == 1:
            return {"__enum__": func, "value": sub(0, v.args[0])}
        return {"__object__": func, "state": sub("state", v.state) if v.state is not None else {}}
    return {"__unknown__": type(v).__name__}
