"""The size of a reconstructed value seen as a tree, measured in time linear in its graph."""

from __future__ import annotations

from typing import Any

from ckptgate.inspect.budget import FileWork
from ckptgate.inspect.pickle.values import Call, Global, PersId, SDict, SList, SSet, Unknown, key_text

__all__ = ["measure_tree"]


_SAT = 1 << 62
_Leaf = (str, bytes, bytearray, int, float, type(None), Global, Unknown)
_PLAIN = frozenset({type(None), bool, float})  # leaves of no size (an int's size depends on it)


def _children(v: Any) -> list[tuple[int, Any]]:
    """(label length, child) for each child of a container, as a tree walk would name them."""
    if isinstance(v, tuple):
        return [(len(str(i)), x) for i, x in enumerate(v)]
    if isinstance(v, SList | SSet):
        return [(len(str(i)), x) for i, x in enumerate(v.items)]
    if isinstance(v, SDict):
        return [c for k, x in v.items for c in ((0, k), (len(key_text(k)), x))]
    if isinstance(v, PersId):
        return [(0, v.pid)]
    if isinstance(v, Call):
        out = [(0, v.func), (4, v.args), (6, v.kwargs), (5, v.state)]
        if v.dict_items is not None:
            out += [c for k, x in v.dict_items for c in ((0, k), (len(key_text(k)), x))]
        if v.list_items is not None:
            out += [(len(str(i)), x) for i, x in enumerate(v.list_items)]
        return out
    return []


def _leaf_bytes(v: Any) -> int:
    if isinstance(v, str | bytes | bytearray):
        return len(v)
    if isinstance(v, Global):
        return len(v.module) + len(v.name)
    if isinstance(v, int):
        return v.bit_length() // 8
    return 0


def measure_tree(root: Any, work: FileWork, max_depth: int) -> tuple[str, int]:
    """The size of ``root`` expanded as a tree, in time linear in its graph (each shared node once).

    Units: one per node, plus one per 64 bytes of strings and key paths counted at every place
    the tree repeats them.  Each graph edge visited is charged to ``work``.  Returns ``("ok",
    units)`` (charged), ``("budget", at least the units it would need)``, ``("deep", depth)`` or
    ``("cycle", 0)``.
    """
    budget = work.remaining()
    done: dict[int, tuple[int, int, int]] = {}  # id -> (nodes, bytes, height), for containers
    on_path: set[int] = set()
    frames: list[tuple[Any, list[tuple[int, Any]], list[int]]] = []
    edges = 0

    def enter(v: Any) -> None:
        """Push a frame for container ``v``, its leaf children summed at once (the common case)."""
        on_path.add(id(v))
        nodes, nbytes, height, inner = 1, _leaf_bytes(v), 1, []
        for label, c in _children(v):
            t = type(c)
            if t in _PLAIN:
                nodes += 1
                nbytes += label + 1
                height = 2
            elif t is str or t is bytes:
                nodes += 1
                nbytes += len(c) + label + 1
                height = 2
            else:
                inner.append((label, c))
        nonlocal edges
        edges += nodes - 1
        frames.append((v, inner, [0, nodes, nbytes, height]))  # [next child, nodes, bytes, height]

    if isinstance(root, _Leaf):
        units = 1 + _leaf_bytes(root) // 64
        return ("ok", units) if work.charge(units) else ("budget", units)
    enter(root)
    while frames:
        v, kids, acc = frames[-1]
        if acc[0] < len(kids):
            label, c = kids[acc[0]]
            acc[0] += 1
            edges += 1
            if isinstance(c, _Leaf):
                got = (1, _leaf_bytes(c), 1)
            elif id(c) in done:
                got = done[id(c)]
            elif id(c) in on_path:
                work.charge(edges)
                return "cycle", 0
            else:
                if len(frames) >= max_depth:
                    work.charge(edges)
                    return "deep", len(frames) + 1
                enter(c)
                continue
        else:
            frames.pop()
            on_path.discard(id(v))
            got = (acc[1], acc[2], acc[3])
            done[id(v)] = got
            if not frames:
                break
            v, kids, acc = frames[-1]
            label = kids[acc[0] - 1][0]
        n, b, h = got
        acc[1] = min(_SAT, acc[1] + n)
        acc[2] = min(_SAT, acc[2] + b + n * (label + 1))
        acc[3] = max(acc[3], h + 1)
        if edges + acc[1] + acc[2] // 64 > budget:
            work.charge(edges)
            return "budget", acc[1] + acc[2] // 64
    n, b, _h = done[id(root)]
    units = n + b // 64
    if edges + units > budget:
        work.charge(edges)
        return "budget", units
    work.charge(edges + units)
    return "ok", units
