"""A static pickle reader: opcode inventory, globals, call sites and a symbolic value.

Nothing is imported, looked up or called.  Opcodes are decoded with :func:`pickletools.genops`
(a decoder that never executes; its ``ValueError`` on a malformed stream becomes a finding and
every finding made before it is kept).  A small symbolic machine replays the stack, the mark
stack and the memo so ``STACK_GLOBAL`` operands are resolved from constants and memo entries
only; anything computed, missing or out-of-band is a finding, never "clean".

Untrusted pickles can execute arbitrary code when loaded [R27]; ``weights_only`` narrows that
risk but is no trust control [R17, R29].  This reader is what lets inspection avoid loading.
"""

from __future__ import annotations

import pickletools
import reprlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from ckptgate.inspect.allowlist import ALLOWLISTS, Allowlist
from ckptgate.inspect.budget import FileWork
from ckptgate.inspect.findings import Finding, error, warning

__all__ = [
    "Call",
    "Global",
    "PersId",
    "PickleLimits",
    "PickleReport",
    "SDict",
    "SList",
    "SSet",
    "Unknown",
    "key_text",
    "looks_like_pickle",
    "read_pickle",
    "refused_report",
]


# -- symbolic values ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Global:
    module: str
    name: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False, slots=True)
class Call:
    """The would-be result of calling ``func`` (REDUCE, NEWOBJ, NEWOBJ_EX, OBJ, INST)."""

    opcode: str
    func: Any
    args: Any
    kwargs: Any = None
    state: Any = None  # BUILD argument, if any
    dict_items: list[tuple[Any, Any]] | None = None  # SETITEM(S) on an OrderedDict
    list_items: list[Any] | None = None


@dataclass(eq=False, slots=True)
class PersId:
    pid: Any


@dataclass(eq=False, slots=True)
class Unknown:
    reason: str


@dataclass(eq=False, slots=True)
class SList:
    items: list[Any] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class SDict:
    items: list[tuple[Any, Any]] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class SSet:
    items: list[Any] = field(default_factory=list)
    frozen: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PickleLimits:
    """Caps that bound the reader's time and memory."""

    max_bytes: int = 512 << 20
    max_ops: int = 50_000_000
    max_memo: int = 10_000_000
    max_stack: int = 1_000_000
    max_frame: int = 1 << 26  # 64 MiB, far above what the pickler writes (64 KiB)
    max_blob: int = 1 << 30
    max_depth: int = 200  # nesting of the reconstructed value (the planners recurse)

    def __post_init__(self) -> None:
        for k in ("max_bytes", "max_ops", "max_memo", "max_stack", "max_frame", "max_blob", "max_depth"):
            if getattr(self, k) <= 0:
                raise ValueError(f"PickleLimits.{k} must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSite:
    opcode: str
    target: str  # dotted global, or "<unresolved>"
    pos: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PickleReport:
    """What the reader found in one pickle stream."""

    path: str
    context: str
    protocol: int | None
    complete: bool  # reached STOP with a well-formed stream
    opcodes: dict[str, int]
    globals: tuple[str, ...]
    calls: tuple[CallSite, ...]
    findings: tuple[Finding, ...]
    inside_allowlist: bool  # every global and call inside the context's allowlist, nothing unresolved
    plain_tensors: bool  # ... and inside the plain-tensor allowlist
    value: Any = field(default=None, repr=False, compare=False)  # symbolic root value (not serialised)
    #: the argument of every PERSID/BINPERSID read, in order, wherever it ends up (not serialised):
    #: an unpickler calls ``persistent_load`` on each as it reads it, reachable from the root or not
    persistent_ids: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    work: int = field(default=0, compare=False)  # work units spent reading (and measuring) it (budget.py)
    #: ``value`` seen as a tree: nodes plus 64-byte blocks of its expanded strings and key paths.
    #: Measured (and charged) before ``value`` is kept; every walk of ``value`` is bounded by it.
    tree_units: int = field(default=0, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "protocol": self.protocol,
            "complete": self.complete,
            "opcodes": dict(sorted(self.opcodes.items())),
            "globals": list(self.globals),
            "calls": [{"opcode": c.opcode, "target": c.target, "pos": c.pos} for c in self.calls],
            "inside_allowlist": self.inside_allowlist,
            "plain_tensors": self.plain_tensors,
        }


def looks_like_pickle(b: bytes) -> bool:
    """A protocol 2-5 header (``\\x80`` + protocol) followed by a plausible opcode."""
    return len(b) >= 3 and b[0] == 0x80 and 2 <= b[1] <= 5 and b[2] in b"\x95}]()cq\x8c\x8aX"


_NESTED_MIN = 8


class _Abort(Exception):
    pass


_CHARGE_EVERY = 1024  # opcodes between charges to the work budget


class _Reader:
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

    # -- helpers --------------------------------------------------------------------------------
    def err(self, code: str, msg: str, **ev: Any) -> None:
        self.findings.append(error(code, self.path, msg, **ev))

    def pop(self, pos: int) -> Any:
        if not self.stack:
            self.err("pickle.stack_underflow", "opcode pops from an empty stack", pos=pos)
            raise _Abort
        return self.stack.pop()

    def pop_mark(self, pos: int) -> list[Any]:
        if not self.metastack:
            self.err("pickle.mark_missing", "opcode needs a MARK that was never pushed", pos=pos)
            raise _Abort
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, v: Any) -> None:
        self.stack.append(v)
        if len(self.stack) + len(self.metastack) > self.limits.max_stack:
            self.err("pickle.stack_limit", "stack depth exceeds the cap", limit=self.limits.max_stack)
            raise _Abort

    def global_ref(self, module: Any, name: Any, pos: int, op: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            self.unresolved = True
            self.err(
                "pickle.unresolved_global",
                f"{op} operands are not constant strings; the global cannot be resolved statically",
                pos=pos,
                module=_short(module),
                name=_short(name),
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
        else:
            target = "<unresolved>"
            self.unresolved = True
            self.err(
                "pickle.call_target_unresolved",
                f"{op} calls something that is not a plain global",
                pos=pos,
                target=_short(func),
            )
        self._call_site(op, target, pos)
        return Call(opcode=op, func=func, args=args, kwargs=kwargs)

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
        except _Abort:
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
        handler = _HANDLERS.get(name)
        if handler is None:  # pragma: no cover - genops knows every opcode we do
            self.err("pickle.unknown_opcode", f"opcode {name} not handled", pos=pos)
            raise _Abort
        handler(self, name, arg, pos)

    def _op_proto(self, name: str, arg: Any, pos: int) -> None:
        if pos != 0 or self.protocol is not None:
            self.err("pickle.proto_misplaced", "PROTO appears other than as the first opcode", pos=pos)
        if not 0 <= arg <= 5:
            self.err("pickle.proto_unknown", f"unknown protocol {arg}", pos=pos)
        if self.protocol is None:
            self.protocol = int(arg)

    def _op_frame(self, name: str, arg: Any, pos: int) -> None:
        if arg > self.limits.max_frame or arg > len(self.data) - pos - 9:
            self.err("pickle.frame_too_large", "FRAME length exceeds the cap or the stream", pos=pos, length=int(arg))
            raise _Abort

    def _op_mark(self, name: str, arg: Any, pos: int) -> None:
        self.metastack.append(self.stack)
        self.stack = []
        if len(self.metastack) > self.limits.max_stack:
            self.err("pickle.stack_limit", "mark depth exceeds the cap")
            raise _Abort

    def _op_int(self, name: str, arg: Any, pos: int) -> None:
        self.push(arg)

    def _op_string(self, name: str, arg: Any, pos: int) -> None:
        self.push(arg)

    def _op_binbytes(self, name: str, arg: Any, pos: int) -> None:
        if len(arg) > self.limits.max_blob:
            self.err("pickle.blob_too_large", "bytes constant exceeds the cap", pos=pos, length=len(arg))
            raise _Abort
        if len(arg) >= _NESTED_MIN and (looks_like_pickle(arg) or arg[:4] == b"PK\x03\x04"):
            self.err(
                "pickle.nested_pickle",
                "a bytes constant holds a pickle or zip that a loader could unpickle in turn",
                pos=pos,
                length=len(arg),
            )
        self.push(bytes(arg))

    def _op_none(self, name: str, arg: Any, pos: int) -> None:
        self.push(None)

    def _op_newtrue(self, name: str, arg: Any, pos: int) -> None:
        self.push(True)

    def _op_newfalse(self, name: str, arg: Any, pos: int) -> None:
        self.push(False)

    def _op_next_buffer(self, name: str, arg: Any, pos: int) -> None:
        self.unresolved = True
        self.err("pickle.out_of_band_buffer", f"{name} needs out-of-band buffers; unresolvable", pos=pos)
        if name == "NEXT_BUFFER":
            self.push(Unknown("out-of-band buffer"))

    def _op_empty_list(self, name: str, arg: Any, pos: int) -> None:
        self.push(SList())

    def _op_empty_tuple(self, name: str, arg: Any, pos: int) -> None:
        self.push(())

    def _op_empty_dict(self, name: str, arg: Any, pos: int) -> None:
        self.push(SDict())

    def _op_empty_set(self, name: str, arg: Any, pos: int) -> None:
        self.push(SSet())

    def _op_list(self, name: str, arg: Any, pos: int) -> None:
        self.push(SList(self.pop_mark(pos)))

    def _op_tuple(self, name: str, arg: Any, pos: int) -> None:
        self.push(tuple(self.pop_mark(pos)))

    def _op_tuple1(self, name: str, arg: Any, pos: int) -> None:
        st = self.stack
        k = int(name[-1])
        if len(st) < k:
            self.err("pickle.stack_underflow", f"{name} pops {k} items from a stack of {len(st)}", pos=pos)
            raise _Abort
        items = st[-k:]
        del st[-k:]
        self.push(tuple(items))

    def _op_dict(self, name: str, arg: Any, pos: int) -> None:
        items = self.pop_mark(pos)
        if len(items) % 2:
            self.err("pickle.odd_dict_items", "DICT with an odd number of items", pos=pos)
            raise _Abort
        self.push(SDict(list(zip(items[::2], items[1::2], strict=True))))

    def _op_frozenset(self, name: str, arg: Any, pos: int) -> None:
        self.push(SSet(self.pop_mark(pos), frozen=True))

    def _op_append(self, name: str, arg: Any, pos: int) -> None:
        items = self.pop_mark(pos) if name == "APPENDS" else [self.pop(pos)]
        target = self.stack[-1] if self.stack else None
        if isinstance(target, SList):
            target.items.extend(items)
        elif isinstance(target, Call) and self._is_list_like(target):
            (target.list_items if target.list_items is not None else _init_list(target)).extend(items)
        else:
            self.outside = True
            self.err(
                "pickle.append_non_list",
                f"{name} on a value that is not a list calls its append/extend method",
                pos=pos,
                target=_short(target),
            )

    def _op_setitem(self, name: str, arg: Any, pos: int) -> None:
        if name == "SETITEMS":
            items = self.pop_mark(pos)
        else:
            v = self.pop(pos)
            k = self.pop(pos)
            items = [k, v]
        if len(items) % 2:
            self.err("pickle.odd_dict_items", f"{name} with an odd number of items", pos=pos)
            raise _Abort
        target = self.stack[-1] if self.stack else None
        pairs = list(zip(items[::2], items[1::2], strict=True))
        if isinstance(target, SDict):
            target.items.extend(pairs)
        elif isinstance(target, Call) and self._is_dict_like(target):
            if target.dict_items is None:
                target.dict_items = []
            target.dict_items.extend(pairs)
        else:
            self.outside = True
            self.err(
                "pickle.setitem_non_dict",
                f"{name} on a value that is not a dict calls its __setitem__",
                pos=pos,
                target=_short(target),
            )

    def _op_additems(self, name: str, arg: Any, pos: int) -> None:
        items = self.pop_mark(pos)
        target = self.stack[-1] if self.stack else None
        if isinstance(target, SSet) and not target.frozen:
            target.items.extend(items)
        else:
            self.outside = True
            self.err("pickle.additems_non_set", "ADDITEMS on a value that is not a set", pos=pos)

    def _op_pop(self, name: str, arg: Any, pos: int) -> None:
        self.pop(pos)

    def _op_pop_mark(self, name: str, arg: Any, pos: int) -> None:
        self.pop_mark(pos)

    def _op_dup(self, name: str, arg: Any, pos: int) -> None:
        st = self.stack
        self.push(st[-1] if st else self.pop(pos))

    def _op_put(self, name: str, arg: Any, pos: int) -> None:
        if not self.stack:
            self.pop(pos)
        idx = len(self.memo) if name == "MEMOIZE" else int(arg)
        if idx < 0:
            self.err("pickle.bad_memo_key", "negative memo key", pos=pos)
            raise _Abort
        self.memo[idx] = self.stack[-1]
        if len(self.memo) > self.limits.max_memo:
            self.err("pickle.memo_limit", "memo size exceeds the cap", limit=self.limits.max_memo)
            raise _Abort

    def _op_get(self, name: str, arg: Any, pos: int) -> None:
        idx = int(arg)
        if idx not in self.memo:
            self.unresolved = True
            self.err("pickle.memo_missing", f"{name} of memo key {idx} that was never stored", pos=pos, key=idx)
            raise _Abort
        self.push(self.memo[idx])

    def _op_global(self, name: str, arg: Any, pos: int) -> None:
        module, _, gname = str(arg).partition(" ")
        self.push(self.global_ref(module, gname, pos, name))

    def _op_stack_global(self, name: str, arg: Any, pos: int) -> None:
        gname = self.pop(pos)
        module = self.pop(pos)
        self.push(self.global_ref(module, gname, pos, name))

    def _op_inst(self, name: str, arg: Any, pos: int) -> None:
        module, _, gname = str(arg).partition(" ")
        args = tuple(self.pop_mark(pos))
        self.push(self.call(name, self.global_ref(module, gname, pos, name), args, pos))

    def _op_obj(self, name: str, arg: Any, pos: int) -> None:
        items = self.pop_mark(pos)
        if not items:
            self.err("pickle.stack_underflow", "OBJ without a class", pos=pos)
            raise _Abort
        self.push(self.call(name, items[0], tuple(items[1:]), pos))

    def _op_newobj(self, name: str, arg: Any, pos: int) -> None:
        args = self.pop(pos)
        cls = self.pop(pos)
        self.push(self.call(name, cls, args, pos))

    def _op_newobj_ex(self, name: str, arg: Any, pos: int) -> None:
        kwargs = self.pop(pos)
        args = self.pop(pos)
        cls = self.pop(pos)
        self.push(self.call(name, cls, args, pos, kwargs))

    def _op_reduce(self, name: str, arg: Any, pos: int) -> None:
        args = self.pop(pos)
        func = self.pop(pos)
        self.push(self.call(name, func, args, pos))

    def _op_build(self, name: str, arg: Any, pos: int) -> None:
        state = self.pop(pos)
        target = self.stack[-1] if self.stack else self.pop(pos)
        if isinstance(target, Call):
            tname = target.func.dotted if isinstance(target.func, Global) else "<unresolved>"
            self._call_site("BUILD", tname, pos)
            target.state = state
        else:
            self.outside = True
            self.err(
                "pickle.build_non_object",
                "BUILD on a value that is not a constructed object",
                pos=pos,
                target=_short(target),
            )

    def _op_ext1(self, name: str, arg: Any, pos: int) -> None:
        self.unresolved = True
        self.err(
            "pickle.extension_code",
            f"{name} {arg} refers to the copyreg extension registry, which is never consulted",
            pos=pos,
            ext_code=int(arg),
        )
        self.push(Unknown(f"extension {arg}"))

    def _op_persid(self, name: str, arg: Any, pos: int) -> None:
        self.persistent_ids.append(arg)
        self.push(PersId(arg))

    def _op_binpersid(self, name: str, arg: Any, pos: int) -> None:
        self.persistent_ids.append(self.pop(pos))
        self.push(PersId(self.persistent_ids[-1]))

    def _is_dict_like(self, c: Call) -> bool:
        return isinstance(c.func, Global) and c.func.dotted in self.allow.dict_like

    def _is_list_like(self, c: Call) -> bool:
        return isinstance(c.func, Global) and c.func.dotted in self.allow.list_like


_HANDLERS: dict[str, Any] = {
    "PROTO": _Reader._op_proto,
    "FRAME": _Reader._op_frame,
    "MARK": _Reader._op_mark,
    "INT": _Reader._op_int,
    "BININT": _Reader._op_int,
    "BININT1": _Reader._op_int,
    "BININT2": _Reader._op_int,
    "LONG": _Reader._op_int,
    "LONG1": _Reader._op_int,
    "LONG4": _Reader._op_int,
    "FLOAT": _Reader._op_int,
    "BINFLOAT": _Reader._op_int,
    "STRING": _Reader._op_string,
    "BINSTRING": _Reader._op_string,
    "SHORT_BINSTRING": _Reader._op_string,
    "UNICODE": _Reader._op_string,
    "BINUNICODE": _Reader._op_string,
    "SHORT_BINUNICODE": _Reader._op_string,
    "BINUNICODE8": _Reader._op_string,
    "BINBYTES": _Reader._op_binbytes,
    "SHORT_BINBYTES": _Reader._op_binbytes,
    "BINBYTES8": _Reader._op_binbytes,
    "BYTEARRAY8": _Reader._op_binbytes,
    "NONE": _Reader._op_none,
    "NEWTRUE": _Reader._op_newtrue,
    "NEWFALSE": _Reader._op_newfalse,
    "NEXT_BUFFER": _Reader._op_next_buffer,
    "READONLY_BUFFER": _Reader._op_next_buffer,
    "EMPTY_LIST": _Reader._op_empty_list,
    "EMPTY_TUPLE": _Reader._op_empty_tuple,
    "EMPTY_DICT": _Reader._op_empty_dict,
    "EMPTY_SET": _Reader._op_empty_set,
    "LIST": _Reader._op_list,
    "TUPLE": _Reader._op_tuple,
    "TUPLE1": _Reader._op_tuple1,
    "TUPLE2": _Reader._op_tuple1,
    "TUPLE3": _Reader._op_tuple1,
    "DICT": _Reader._op_dict,
    "FROZENSET": _Reader._op_frozenset,
    "APPEND": _Reader._op_append,
    "APPENDS": _Reader._op_append,
    "SETITEM": _Reader._op_setitem,
    "SETITEMS": _Reader._op_setitem,
    "ADDITEMS": _Reader._op_additems,
    "POP": _Reader._op_pop,
    "POP_MARK": _Reader._op_pop_mark,
    "DUP": _Reader._op_dup,
    "PUT": _Reader._op_put,
    "BINPUT": _Reader._op_put,
    "LONG_BINPUT": _Reader._op_put,
    "MEMOIZE": _Reader._op_put,
    "GET": _Reader._op_get,
    "BINGET": _Reader._op_get,
    "LONG_BINGET": _Reader._op_get,
    "GLOBAL": _Reader._op_global,
    "STACK_GLOBAL": _Reader._op_stack_global,
    "INST": _Reader._op_inst,
    "OBJ": _Reader._op_obj,
    "NEWOBJ": _Reader._op_newobj,
    "NEWOBJ_EX": _Reader._op_newobj_ex,
    "REDUCE": _Reader._op_reduce,
    "BUILD": _Reader._op_build,
    "EXT1": _Reader._op_ext1,
    "EXT2": _Reader._op_ext1,
    "EXT4": _Reader._op_ext1,
    "PERSID": _Reader._op_persid,
    "BINPERSID": _Reader._op_binpersid,
}


def _init_list(c: Call) -> list[Any]:
    c.list_items = []
    return c.list_items


_REPR = reprlib.Repr()  # Python 3.11's takes no keyword arguments
for _k, _v in {
    "maxlevel": 2,
    "maxtuple": 4,
    "maxlist": 4,
    "maxdict": 4,
    "maxset": 4,
    "maxfrozenset": 4,
    "maxstring": 60,
    "maxlong": 40,
    "maxother": 40,
}.items():
    setattr(_REPR, _k, _v)


def _short(v: Any) -> str:
    """A short description that costs O(1) whatever ``v`` is (a nested or shared tuple's plain
    repr is as large as the tree it expands to)."""
    r = _REPR.repr(v) if not isinstance(v, (Call, SDict, SList, SSet)) else type(v).__name__
    return r[:80]


def key_text(k: Any) -> str:
    """A dict key as a path component: the string itself, else a bounded repr."""
    if isinstance(k, str):
        return k
    if isinstance(k, bool | float) or k is None or (isinstance(k, int) and k.bit_length() <= 64):
        return repr(k)
    return _short(k)


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


def refused_report(*, path: str, context: str, size: int, limit: int) -> PickleReport:
    """The report for a pickle refused unread because it exceeds the size cap."""
    f = error("pickle.too_large", path, "pickle stream exceeds the size cap; not read", size=size, limit=limit)
    return PickleReport(
        path=path,
        context=context,
        protocol=None,
        complete=False,
        opcodes={},
        globals=(),
        calls=(),
        findings=(f,),
        inside_allowlist=False,
        plain_tensors=False,
    )


def read_pickle(
    data: bytes,
    *,
    path: str,
    context: str = "tensors",
    limits: PickleLimits = PickleLimits(),
    work: FileWork | None = None,
) -> PickleReport:
    """Read one pickle stream statically against the ``context`` allowlist, within ``work``
    (by default a per-file budget for ``len(data)`` bytes, charged to no intake)."""
    allow = ALLOWLISTS[context]
    if len(data) > limits.max_bytes:
        return refused_report(path=path, context=context, size=len(data), limit=limits.max_bytes)
    work = work if work is not None else FileWork(path, len(data))
    r = _Reader(data, path, allow, limits, work)
    r.run()
    has_error = any(f.severity == "error" for f in r.findings)
    inside = r.complete and not r.outside and not r.unresolved and not has_error
    tensors = ALLOWLISTS["tensors"]
    plain = inside and all(g in tensors.callables or g in tensors.values for g in r.globals)
    if not r.complete and not r.over_budget and not any(f.code.startswith("pickle.") for f in r.findings):
        r.findings.append(warning("pickle.incomplete", path, "the stream was not read to STOP"))
    return PickleReport(
        path=path,
        context=context,
        protocol=r.protocol,
        complete=r.complete,
        opcodes=dict(r.ops),
        globals=tuple(sorted(r.globals)),
        calls=tuple(r.calls),
        findings=tuple(r.findings),
        inside_allowlist=inside,
        plain_tensors=plain,
        value=r.value if r.complete else None,
        work=work.done,
        tree_units=r.tree_units,
        persistent_ids=tuple(r.persistent_ids),
    )
