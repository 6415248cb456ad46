"""The symbolic machine of the static pickle reader: stack, mark stack, memo, globals, calls.

``run`` decodes opcodes with :func:`pickletools.genops` (a decoder that never executes) and
hands each to ``step``, which dispatches through ``HANDLERS`` (:mod:`.opcodes` fills it).
Globals are checked against the context's allowlist as they are referenced; calls as they are
made.  Nothing is imported, looked up or called.
"""

from __future__ import annotations

import pickletools
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar, cast

from ckptgate.inspect.allowlist import Allowlist
from ckptgate.inspect.budget import FileWork
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.pickle.report import CallSite, PickleLimits
from ckptgate.inspect.pickle.tree import measure_tree
from ckptgate.inspect.pickle.values import Call, Global, SDict, SList, Unknown, short

__all__ = ["Abort", "Machine"]


class Abort(Exception):
    pass


def _empty(v: Any) -> bool:
    """No argument at all: none, an empty tuple, or an empty list or dict."""
    return v is None or v == () or (isinstance(v, SDict | SList) and not v.items)


def _no_state(v: Any) -> bool:
    """An object state that sets nothing: empty, or an empty ``(dict state, slots state)`` pair."""
    return _empty(v) or (isinstance(v, tuple) and len(v) == 2 and _empty(v[0]) and _empty(v[1]))


#: The attributes producers set on a saved tensor through ``_rebuild_from_type_v2``'s state, with
#: the type of their value (DeepSpeed ZeRO-3's ``ds_id``; ``_has_been_cloned``, from the pinned
#: producers' fixtures).  Any other name may be one torch.Tensor defines (``data``, ``real``).
_TENSOR_ATTRIBUTES: dict[str, type] = {"ds_id": str, "_has_been_cloned": bool}


def _plain_attributes(v: Any) -> bool:
    """A ``_rebuild_from_type_v2`` state that sets only :data:`_TENSOR_ATTRIBUTES` (or nothing)."""
    if isinstance(v, tuple) and len(v) == 2 and _empty(v[1]):
        v = v[0]
    if _empty(v):
        return True
    return isinstance(v, SDict) and all(
        isinstance(k, str) and k in _TENSOR_ATTRIBUTES and isinstance(x, _TENSOR_ATTRIBUTES[k]) for k, x in v.items
    )


#: Tensor rebuilds and the argument (index) holding what torch applies to the tensor after building
#: it from storage, offset, size and stride: ``metadata`` (``{"neg": True}`` negates it, ``conj``
#: conjugates it, torch._utils.set_tensor_metadata) and ``_rebuild_from_type_v2``'s state (setattr of
#: each item: ``data`` swaps in another tensor).  A BUILD on any of their results is ``Tensor.set_``
#: (Tensor.__setstate__: another storage, offset and size).  torch.load applies each, weights_only
#: too; the layout reads the storage bytes alone.  A plain tensor's save writes none of them, and a
#: subclass's state only the :data:`_TENSOR_ATTRIBUTES`.
_TENSOR_STATE_ARG = {
    "torch._utils._rebuild_tensor_v2": 6,
    "torch._utils._rebuild_tensor_v3": 7,
    "torch._utils._rebuild_parameter": None,
    "torch._tensor._rebuild_from_type_v2": 3,
    "torch.Size": None,
}


#: ``_rebuild_from_type_v2`` calls its first argument with its third: the rebuild inside is
#: followed this many levels (producers write one; each level is a tuple the pickle spelled out)
_MAX_REBUILD_NESTING = 4


def _applies_state(target: str, args: Any) -> bool:
    """Whether a call of ``target`` with ``args`` applies a state or metadata to the tensor it
    rebuilds, counting the rebuild ``_rebuild_from_type_v2(func, type, args, state)`` makes of
    ``func(*args)``: its metadata is applied as if the pickle had called ``func`` itself."""
    for _ in range(_MAX_REBUILD_NESTING + 1):  # the calls, then the rebuild they name
        i = _TENSOR_STATE_ARG.get(target)
        if not isinstance(args, tuple):
            return False
        plain = _plain_attributes if target.endswith("_from_type_v2") else _no_state
        if i is not None and len(args) > i and not plain(args[i]):
            return True
        if target != "torch._tensor._rebuild_from_type_v2" or len(args) < 3 or not isinstance(args[0], Global):
            return False
        target, args = args[0].dotted, args[2]
    return True  # nested deeper than any producer writes: not followed, so not read as plain


_CHARGE_EVERY = 1024  # opcodes between charges to the work budget


class Machine:
    #: opcode name -> handler, filled by :mod:`.opcodes`
    HANDLERS: ClassVar[dict[str, Any]] = {}

    def __init__(self, data: bytes, path: str, allow: Allowlist, limits: PickleLimits, work: FileWork) -> None:
        self.data = data
        self.work = work
        self.over_budget = False
        self.tree_units = 0
        self._call_seen: set[tuple[str, str]] = set()
        self.path = path
        self.allow = allow
        self.limits = limits
        self.findings: list[Finding] = []
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.ops: Counter[str] = Counter()
        self.globals: set[str] = set()
        self.calls: list[CallSite] = []
        self.outside = False
        self.unresolved = False
        self.protocol: int | None = None
        self.complete = False
        self.value: Any = None
        self.persistent_ids: list[Any] = []
        #: id(dict or dict-like call) -> (it, the constant keys it holds); keeps it alive, so no id is reused
        self.dict_keys: dict[int, tuple[Any, set[Any]]] = {}

    # -- helpers --------------------------------------------------------------------------------
    def err(self, code: str, msg: str, **ev: Any) -> None:
        self.findings.append(error(code, self.path, msg, **ev))

    def pop(self, pos: int) -> Any:
        if not self.stack:
            self.err("pickle.stack_underflow", "opcode pops from an empty stack", pos=pos)
            raise Abort
        return self.stack.pop()

    def pop_mark(self, pos: int) -> list[Any]:
        if not self.metastack:
            self.err("pickle.mark_missing", "opcode needs a MARK that was never pushed", pos=pos)
            raise Abort
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, v: Any) -> None:
        self.stack.append(v)
        if len(self.stack) + len(self.metastack) > self.limits.max_stack:
            self.err("pickle.stack_limit", "stack depth exceeds the cap", limit=self.limits.max_stack)
            raise Abort

    def global_ref(self, module: Any, name: Any, pos: int, op: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            self.unresolved = True
            self.err(
                "pickle.unresolved_global",
                f"{op} operands are not constant strings; the global cannot be resolved statically",
                pos=pos,
                module=short(module),
                name=short(name),
            )
            return Unknown(f"{op} with computed operands")
        g = Global(module, name)
        self.globals.add(g.dotted)
        if g.dotted not in self.allow.callables and g.dotted not in self.allow.values:
            self.outside = True
            self.err(
                "pickle.global_not_allowed",
                f"global {g.dotted} is outside the {self.allow.name} allowlist",
                pos=pos,
                globl=g.dotted,
                context=self.allow.name,
            )
        return g

    def call(self, op: str, func: Any, args: Any, pos: int, kwargs: Any = None) -> Call:
        if isinstance(func, Global):
            target = func.dotted
            if target in self.allow.values and target not in self.allow.callables:
                self.outside = True
                self.err(
                    "pickle.call_not_allowed",
                    f"{op} calls {target}, which is allowed only as a value",
                    pos=pos,
                    target=target,
                )
            elif target == "copyreg._reconstructor" and target in self.allow.callables:
                self._check_reconstructor(args, pos)
            elif _applies_state(target, args):
                self._tensor_state(op, target, pos)
            elif (target in self.allow.dict_like or target in self.allow.list_like) and not (
                _empty(args) and _empty(kwargs)
            ):
                # The pickler writes OrderedDict() and fills it with SETITEMS; items given as the
                # arguments of REDUCE, OBJ or INST are loaded (weights_only too), never walked as items.
                self.outside = True
                self.err(
                    "pickle.container_args",
                    f"{op} builds {target} from arguments, which the pickler never writes: "
                    "what they hold is loaded but not read as its items",
                    pos=pos,
                    target=target,
                )
        else:
            target = "<unresolved>"
            self.unresolved = True
            self.err(
                "pickle.call_target_unresolved",
                f"{op} calls something that is not a plain global",
                pos=pos,
                target=short(func),
            )
        self._call_site(op, target, pos)
        return Call(opcode=op, func=func, args=args, kwargs=kwargs)

    def tensor_built(self, target: Call, pos: int) -> None:
        """BUILD on the result of a tensor rebuild (or a ``torch.Size``), which the pickler never
        writes, is refused, an empty state too: ``Tensor.set_()`` empties the tensor."""
        f = target.func.dotted if isinstance(target.func, Global) else None
        if f in _TENSOR_STATE_ARG:
            self._tensor_state("BUILD", f, pos)

    def _tensor_state(self, op: str, target: str, pos: int) -> None:
        self.outside = True
        self.err(
            "pickle.tensor_state",
            f"{op} gives the result of {target} a state or metadata, which torch.load applies to the "
            "tensor (re-pointed, negated, conjugated or an attribute set) and the layout does not read",
            pos=pos,
            target=target,
        )

    def _call_site(self, op: str, target: str, pos: int) -> None:
        """The inventory keeps each (opcode, target) once, at its first position: a long run of
        calls or BUILDs adds nothing to the report (and the policy input) after the first."""
        if (op, target) not in self._call_seen:
            self._call_seen.add((op, target))
            self.calls.append(CallSite(opcode=op, target=target, pos=pos))

    def _check_reconstructor(self, args: Any, pos: int) -> None:
        ok = (
            isinstance(args, tuple)
            and len(args) == 3
            and isinstance(args[0], Global)
            and args[0].dotted in self.allow.callables
            and isinstance(args[1], Global)
            and args[1].dotted in ("builtins.object", "__builtin__.object")
            and args[2] is None
        )
        if not ok:
            self.outside = True
            self.err(
                "pickle.call_not_allowed",
                "copyreg._reconstructor is allowed only as (allowlisted class, object, None)",
                pos=pos,
            )

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        n = 0
        data = self.data
        last_pos = -1
        try:
            # genops over bytes reads a BytesIO, whose tell() always gives the position: never None here.
            ops = cast("Iterator[tuple[pickletools.OpcodeInfo, Any, int]]", pickletools.genops(data))
            for opcode, arg, pos in ops:
                n += 1
                last_pos = pos
                if n % _CHARGE_EVERY == 0 and not self.work.charge(_CHARGE_EVERY):
                    self.over_budget = True
                    self.findings.append(self.work.refusal(f"decoding the pickle's opcodes (at byte {pos})"))
                    self.work.exhaust()
                    return
                if n > self.limits.max_ops:
                    self.err("pickle.op_limit", "opcode count exceeds the cap", limit=self.limits.max_ops)
                    return
                name = opcode.name
                self.ops[name] += 1
                if name == "STOP":
                    self.value = self.pop(pos)
                    if self.stack or self.metastack:
                        self.err("pickle.stack_not_empty", "values or marks left on the stack at STOP", pos=pos)
                    end = pos + 1
                    if end != len(data):
                        self.err(
                            "pickle.trailing_data", "bytes follow the STOP opcode", pos=end, trailing=len(data) - end
                        )
                    self.complete = True
                    self.work.charge(n % _CHARGE_EVERY)
                    n = 0
                    self._measure()
                    return
                self.step(name, arg, pos)
            self.err("pickle.no_stop", "the stream ends without a STOP opcode", pos=last_pos)
        except Abort:
            return
        except (
            ValueError,
            KeyError,
            IndexError,
            TypeError,
            OverflowError,
            UnicodeDecodeError,
            MemoryError,
            RecursionError,
        ) as e:
            if "exhausted before seeing STOP" in str(e):
                self.err("pickle.no_stop", "the stream ends without a STOP opcode", pos=last_pos)
                return
            self.err(
                "pickle.malformed", f"malformed pickle stream: {type(e).__name__}: {str(e)[:200]}", after_pos=last_pos
            )
        finally:
            if n % _CHARGE_EVERY and not self.over_budget:  # the opcodes since the last block
                self.work.charge(n % _CHARGE_EVERY)

    def _measure(self) -> None:
        """Measure the value as a tree (every later walk sees it so) and charge that, or drop it."""
        verdict, amount = measure_tree(self.value, self.work, self.limits.max_depth)
        if verdict == "ok":
            self.tree_units = amount
            return
        self.value = None
        if verdict == "deep":
            self.err(
                "pickle.too_deep",
                f"the reconstructed value nests deeper than {self.limits.max_depth} levels",
                limit=self.limits.max_depth,
            )
        elif verdict == "cycle":
            self.err("pickle.cyclic_value", "the reconstructed value contains itself: seen as a tree it never ends")
        else:
            self.over_budget = True
            self.findings.append(
                self.work.refusal("the reconstructed value, seen as a tree (memo expansion)", at_least=amount)
            )
            self.work.exhaust()

    def step(self, name: str, arg: Any, pos: int) -> None:
        """Replay one opcode: one dictionary look-up, then its handler."""
        handler = self.HANDLERS.get(name)
        if handler is None:  # pragma: no cover - genops knows every opcode we do
            self.err("pickle.unknown_opcode", f"opcode {name} not handled", pos=pos)
            raise Abort
        handler(self, name, arg, pos)
