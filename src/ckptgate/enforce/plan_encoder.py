"""The placement-plan encoder: an unpickled object tree, turned into JSON inside the worker.

Runs in the contained worker after the load, so everything it touches may be hostile: it reads
objects through ``object.__getattribute__`` and the types' own dictionaries, bounds the tree
(:class:`PlanBudget`), and turns every tensor into a ``__tensor__`` record of storage key, dtype,
shape, stride and offset, never its data.  The parent receives the result in a ``plan`` record
(:mod:`ckptgate.enforce.protocol`).
"""

from __future__ import annotations

import base64
import enum
import math
import sys
import types
from typing import Any, NamedTuple

from ckptgate.enforce.protocol import WorkerError

__all__ = ["PlanBudget", "PlanEncoder", "dtype_name"]

_NO_FIELDS = object()  # a tuple whose class has no ``_fields``: not a named tuple


class PlanBudget:
    """Bounds on the object tree: nodes in all files together, and depth."""

    def __init__(self, max_nodes: int, max_depth: int) -> None:
        self.nodes = 0
        self.max_nodes = max_nodes
        self.max_depth = max_depth

    def tick(self, depth: int) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise WorkerError("runtime.worker.plan_too_large", f"the object tree has more than {self.max_nodes} nodes")
        if depth > self.max_depth:
            raise WorkerError("runtime.worker.plan_too_large", f"the object tree is deeper than {self.max_depth}")


def _qualname(obj: Any) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', t.__name__)}"


def dtype_name(dtype: Any) -> str:
    """A torch dtype's name as the protocol carries it (``float32``)."""
    return str(dtype).removeprefix("torch.")


class StorageRecord(NamedTuple):
    """What the unpickler saw for one storage: its key in the torch zip, and the byte size its
    persistent id declares (None when the id carries no element count)."""

    key: str
    nbytes: int | None


class PlanEncoder:
    """Turns an unpickled object tree into JSON; tensors become ``__tensor__`` records."""

    def __init__(self, storage_keys: dict[int, StorageRecord], budget: PlanBudget) -> None:
        import torch  # noqa: PLC0415 - torch, heavy optional: worker only

        self.torch = torch
        self.keys = storage_keys
        self.budget = budget
        self.tensors: list[tuple[list[Any], Any]] = []  # (path, tensor), in tree order
        self._stack: set[int] = set()

    def encode(self, obj: Any, path: list[Any], depth: int = 0) -> Any:
        self.budget.tick(depth)
        torch = self.torch
        if obj is None or type(obj) is bool:
            return obj
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, enum.Enum):
            return {"__enum__": _qualname(obj), "name": obj.name, "value": self.encode(obj.value, path, depth + 1)}
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            f = float(obj)
            return f if math.isfinite(f) else {"__float__": repr(f)}
        if isinstance(obj, complex):
            return {"__complex__": [self.encode(obj.real, path, depth + 1), self.encode(obj.imag, path, depth + 1)]}
        if isinstance(obj, (bytes, bytearray)):
            data = bytes(obj)
            return {"__bytes__": base64.b64encode(data).decode() if len(data) <= 1 << 20 else None, "len": len(data)}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, torch.dtype):
            return {"__dtype__": dtype_name(obj)}
        if isinstance(obj, torch.device):
            return {"__device__": str(obj)}
        if isinstance(obj, torch.Size):
            return [int(d) for d in obj]
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            raw = obj.tobytes() if obj.nbytes <= 1 << 16 else None
            return {
                "__ndarray__": {
                    "dtype": str(obj.dtype),
                    "shape": list(obj.shape),
                    "data": base64.b64encode(raw).decode() if raw is not None else None,
                }
            }
        if np is not None and isinstance(obj, np.generic):
            return self.encode(obj.item(), path, depth + 1)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
            if isinstance(obj, types.ModuleType):
                return {"__global__": obj.__name__}
            return {"__global__": f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"}
        key = id(obj)
        if key in self._stack:
            return {"__cycle__": True}
        self._stack.add(key)
        try:
            return self._container(obj, path, depth)
        finally:
            self._stack.discard(key)

    def _container(self, obj: Any, path: list[Any], depth: int) -> Any:
        if isinstance(obj, dict):
            items = list(obj.items())
            if all(type(k) is str and not (k.startswith("__") and k.endswith("__")) for k, _ in items):
                return {k: self.encode(v, [*path, k], depth + 1) for k, v in items}
            return {
                "__map__": [
                    [self.encode(k, path, depth + 1), self.encode(v, [*path, _path_key(k)], depth + 1)]
                    for k, v in items
                ]
            }
        fields: Any = getattr(type(obj), "_fields", _NO_FIELDS) if isinstance(obj, tuple) else _NO_FIELDS
        if fields is not _NO_FIELDS:  # a named tuple (the pickle's class decides its field names)
            names = [str(f) for f in fields] if isinstance(fields, (tuple, list)) else []
            if len(names) != len(obj) or len(set(names)) != len(names):  # zip would drop or merge items
                raise WorkerError(
                    "runtime.worker.unencodable",
                    f"a {_qualname(obj)} at {path!r} holds {len(obj)} items but names {len(names)} distinct "
                    "fields; it cannot be encoded without losing one",
                )
            return {
                "__object__": _qualname(obj),
                "state": {
                    str(f): self.encode(v, [*path, i], depth + 1)
                    for i, (f, v) in enumerate(zip(names, obj, strict=True))
                },
            }
        if isinstance(obj, (list, tuple)):
            return [self.encode(v, [*path, i], depth + 1) for i, v in enumerate(obj)]
        if isinstance(obj, (set, frozenset)):
            return {"__set__": [self.encode(v, path, depth + 1) for v in obj]}
        state: dict[str, Any] = {}
        try:
            d = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            d = None
        if isinstance(d, dict):
            state.update(d)
        for cls in type(obj).__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for slot in slots if isinstance(slots, (tuple, list)) else ():
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and slot not in state:
                    try:
                        state[slot] = object.__getattribute__(obj, slot)
                    except AttributeError:
                        pass
        return {"__object__": _qualname(obj), "state": self._container(state, path, depth) if state else {}}

    def _tensor(self, t: Any, path: list[Any]) -> Any:
        torch = self.torch
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
            return {"__object__": _qualname(t), "tensor": True, "supported": False, "layout": str(t.layout)}
        storage = t.untyped_storage()
        self.tensors.append((list(path), t))
        seen = self.keys.get(storage._cdata)
        nbytes = seen.nbytes if seen is not None and seen.nbytes is not None else int(storage.nbytes())
        return {
            "__tensor__": {
                "storage_key": seen.key if seen is not None else None,
                "dtype": dtype_name(t.dtype),
                "shape": [int(d) for d in t.shape],
                "stride": [int(s) for s in t.stride()],
                "storage_offset": int(t.storage_offset()),
                "storage_nbytes": nbytes,
                "parameter": type(t) is torch.nn.Parameter,
            }
        }


def _path_key(k: Any) -> Any:
    return k if type(k) in (str, int) else repr(k)
