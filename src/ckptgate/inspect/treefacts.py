"""The structure of a DCP tree's top-level subtrees, measured for the selection policy.

A training loop's ``dcp.save`` nests the model beside its resume state under top-level keys
(torchtitan: ``model``, ``optimizer``, ``lr_scheduler``, ``dataloader``, ``train_state``,
``extra``; any other names elsewhere).  Which subtree is the model is decided in Rego
(``intake/selection.rego``) from what this module measures about each top-level key, never from
its name:

* ``children``: the names one level below the key, and ``optimizer_state_paths``: whether every
  entry under ``<key>.state.`` names a parameter and a moment (``state.<param>.<moment>``), which
  together show ``torch.optim.Optimizer.state_dict()``'s structure (``state`` beside
  ``param_groups``; ``get_optimizer_state_dict`` names parameters by FQN, a plain state dict by
  index);
* ``layouts``: the distinct ``(dtype, shape)`` of its tensors with at least one dimension, with
  counts, so policy data can match known generator states (torch's CPU generator state is a
  ``uint8`` tensor of 5056 bytes, a CUDA generator's 16 bytes);
* ``scalar_dtypes`` and ``bytes_items``: counters and loop state are 0-dim tensors or non-tensor
  leaves (BYTE_IO items: ints, lists, Python and NumPy RNG state tuples, dataloader state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_CHILDREN", "MAX_LAYOUTS", "tree_facts"]

#: Caps that keep the policy input small however wide a subtree is; ``*_count`` gives the full size.
MAX_CHILDREN = 32
MAX_LAYOUTS = 16


def tree_facts(tensors: Iterable[Mapping[str, Any]], bytes_items: Iterable[str]) -> list[dict[str, Any]]:
    """One record per top-level key of a DCP tree, from its tensors (``fqn``, ``dtype``, ``size``)
    and its BYTE_IO item names, sorted by key."""
    keys: dict[str, dict[str, Any]] = {}

    def rec(fqn: str) -> tuple[dict[str, Any], list[str]]:
        head, *rest = fqn.split(".")
        r = keys.setdefault(
            head,
            {
                "leaf": False,
                "tensors": 0,
                "bytes_items": 0,
                "children": set(),
                "layouts": Counter(),
                "scalar_dtypes": set(),
                "optimizer_state_paths": True,
            },
        )
        if not rest:
            r["leaf"] = True
        else:
            r["children"].add(rest[0])
            if rest[0] == "state" and len(rest) < 3:  # state.<param>.<moment> at the least
                r["optimizer_state_paths"] = False
        return r, rest

    for t in tensors:
        r, _ = rec(str(t["fqn"]))
        r["tensors"] += 1
        size = t.get("size")
        shape = tuple(size) if isinstance(size, list | tuple) else None
        if shape == ():
            r["scalar_dtypes"].add(str(t.get("dtype")))
        else:
            r["layouts"][(str(t.get("dtype")), shape)] += 1
    for name in bytes_items:
        r, _ = rec(name)
        r["bytes_items"] += 1
    out = []
    for key in sorted(keys):
        r = keys[key]
        children = sorted(r["children"])
        layouts = sorted(r["layouts"].items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1] or ()))
        out.append(
            {
                "key": key,
                "leaf": r["leaf"],
                "tensors": r["tensors"],
                "bytes_items": r["bytes_items"],
                "children": children[:MAX_CHILDREN],
                "children_count": len(children),
                "optimizer_state_paths": r["optimizer_state_paths"] and "state" in r["children"],
                "layouts": [
                    {"dtype": d, "shape": None if s is None else list(s), "count": n}
                    for (d, s), n in layouts[:MAX_LAYOUTS]
                ],
                "layouts_count": len(layouts),
                "scalar_dtypes": sorted(r["scalar_dtypes"]),
            }
        )
    return out
