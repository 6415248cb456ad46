"""The opcode handlers of the static pickle reader: one method per opcode family, one table.

Constructors of plain data (numbers, strings, containers) push symbolic values; globals,
calls and BUILD are recorded through :class:`.machine.Machine`; SETITEM(S), APPEND(S) and
ADDITEMS are replayed only on the containers (and allowlisted dict- and list-like call results)
whose methods they would call.
"""

from __future__ import annotations

import re
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from typing import Any

from ckptgate.inspect.pickle.machine import Abort, Machine
from ckptgate.inspect.pickle.report import looks_like_pickle
from ckptgate.inspect.pickle.values import Call, Global, PersId, SDict, SList, SSet, Unknown, short

__all__ = ["Reader"]

_NESTED_MIN = 8

#: The decimal text the pickler writes for INT (``I00``/``I01`` are False/True) and LONG.  The C
#: unpickler torch.load uses reads INT with ``strtol(s, 0)`` and LONG with base 0, and takes any
#: 0/1 of three bytes (``+1``, `` 1``, ``-0``) as a bool; ``pickletools`` reads both in base 10.
#: So ``I010`` is 8 to torch and 10 to genops: any other spelling is ambiguous, not read.
_CANONICAL_TEXT_INT = {
    "INT": re.compile(rb"(?:0[01]?|-?[1-9][0-9]*)\n"),
    "LONG": re.compile(rb"(?:0|-?[1-9][0-9]*)L?\n"),
}


class Reader(Machine):
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
            raise Abort

    def _op_mark(self, name: str, arg: Any, pos: int) -> None:
        self.metastack.append(self.stack)
        self.stack = []
        if len(self.metastack) > self.limits.max_stack:
            self.err("pickle.stack_limit", "mark depth exceeds the cap")
            raise Abort

    def _ambiguous(self, name: str, pos: int, why: str, **ev: Any) -> None:
        """A constant whose value depends on the unpickler: never read as any one of them."""
        self.unresolved = True
        self.err("pickle.ambiguous_literal", f"{name} at byte {pos} {why}", pos=pos, opcode=name, **ev)
        self.push(Unknown(f"ambiguous {name}"))

    def _op_int(self, name: str, arg: Any, pos: int) -> None:
        canonical = _CANONICAL_TEXT_INT.get(name)
        end = self.data.find(b"\n", pos + 1) + 1 if canonical is not None else 0  # genops read the line
        if canonical is not None and not canonical.fullmatch(self.data, pos + 1, end):
            text = self.data[pos + 1 : end - 1]
            self._ambiguous(
                name,
                pos,
                "is not written as the pickler writes it: CPython's unpickler reads it in base 0 "
                "(a leading 0 is octal) where a base-10 decoder does not",
                text=short(text),
            )
            return
        if isinstance(arg, int) and arg.bit_length() > self.limits.max_int_bits:
            self.unresolved = True
            self.err(
                "pickle.int_too_large",
                f"{name} holds a {arg.bit_length()}-bit integer, wider than the {self.limits.max_int_bits}-bit cap",
                pos=pos,
                bits=arg.bit_length(),
                limit=self.limits.max_int_bits,
            )
            self.push(Unknown(f"{arg.bit_length()}-bit integer"))
            return
        self.push(arg)

    def _op_string(self, name: str, arg: Any, pos: int) -> None:
        if name in ("BINSTRING", "SHORT_BINSTRING") and not arg.isascii():
            # Python 2 str bytes: pickletools decodes them as latin-1, torch.load's unpickler with
            # encoding="utf-8", pickle.load's default refuses them and encoding="bytes" keeps bytes.
            self._ambiguous(name, pos, "holds non-ASCII bytes, which each unpickler decodes with its own encoding")
            return
        self.push(arg)

    def _op_binbytes(self, name: str, arg: Any, pos: int) -> None:
        if len(arg) > self.limits.max_blob:
            self.err("pickle.blob_too_large", "bytes constant exceeds the cap", pos=pos, length=len(arg))
            raise Abort
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
            raise Abort
        items = st[-k:]
        del st[-k:]
        self.push(tuple(items))

    def _op_dict(self, name: str, arg: Any, pos: int) -> None:
        items = self.pop_mark(pos)
        if len(items) % 2:
            self.err("pickle.odd_dict_items", "DICT with an odd number of items", pos=pos)
            raise Abort
        d = SDict(list(zip(items[::2], items[1::2], strict=True)))
        self._keys_unique(d, d.items, pos)
        self.push(d)

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
                target=short(target),
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
            raise Abort
        target = self.stack[-1] if self.stack else None
        pairs = list(zip(items[::2], items[1::2], strict=True))
        if isinstance(target, SDict):
            self._keys_unique(target, pairs, pos)
            target.items.extend(pairs)
        elif isinstance(target, Call) and self._is_dict_like(target):
            self._keys_unique(target, pairs, pos)
            if target.dict_items is None:
                target.dict_items = []
            target.dict_items.extend(pairs)
        else:
            self.outside = True
            self.err(
                "pickle.setitem_non_dict",
                f"{name} on a value that is not a dict calls its __setitem__",
                pos=pos,
                target=short(target),
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
            raise Abort
        self.memo[idx] = self.stack[-1]
        if len(self.memo) > self.limits.max_memo:
            self.err("pickle.memo_limit", "memo size exceeds the cap", limit=self.limits.max_memo)
            raise Abort

    def _op_get(self, name: str, arg: Any, pos: int) -> None:
        idx = int(arg)
        if idx not in self.memo:
            self.unresolved = True
            self.err("pickle.memo_missing", f"{name} of memo key {idx} that was never stored", pos=pos, key=idx)
            raise Abort
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
            raise Abort
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
            self.tensor_built(target, pos)
            target.state = state
        else:
            self.outside = True
            self.err(
                "pickle.build_non_object",
                "BUILD on a value that is not a constructed object",
                pos=pos,
                target=short(target),
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

    def _keys_unique(self, target: SDict | Call, pairs: list[tuple[Any, Any]], pos: int) -> None:
        """A key the dict already holds: the unpickler keeps the last value alone (``1``, ``1.0``
        and ``True`` are one key), where every reader of the items would see each.  Keys that are
        constants are compared as Python compares them; a symbolic key (a call's result) cannot be."""
        seen = self.dict_keys.setdefault(id(target), (target, set()))[1]
        for k, _v in pairs:
            if not _constant(k):
                continue
            k = tuple(map(_python3_name, k)) if isinstance(k, tuple) else _python3_name(k)
            if k in seen:
                self.err(
                    "pickle.duplicate_key",
                    f"a dict key repeats ({short(k)}): an unpickler keeps only its last value",
                    pos=pos,
                    key=short(k),
                )
                raise Abort
            seen.add(k)

    def _is_dict_like(self, c: Call) -> bool:
        return isinstance(c.func, Global) and c.func.dotted in self.allow.dict_like

    def _is_list_like(self, c: Call) -> bool:
        return isinstance(c.func, Global) and c.func.dotted in self.allow.list_like


Reader.HANDLERS = {
    "PROTO": Reader._op_proto,
    "FRAME": Reader._op_frame,
    "MARK": Reader._op_mark,
    "INT": Reader._op_int,
    "BININT": Reader._op_int,
    "BININT1": Reader._op_int,
    "BININT2": Reader._op_int,
    "LONG": Reader._op_int,
    "LONG1": Reader._op_int,
    "LONG4": Reader._op_int,
    "FLOAT": Reader._op_int,
    "BINFLOAT": Reader._op_int,
    "STRING": Reader._op_string,
    "BINSTRING": Reader._op_string,
    "SHORT_BINSTRING": Reader._op_string,
    "UNICODE": Reader._op_string,
    "BINUNICODE": Reader._op_string,
    "SHORT_BINUNICODE": Reader._op_string,
    "BINUNICODE8": Reader._op_string,
    "BINBYTES": Reader._op_binbytes,
    "SHORT_BINBYTES": Reader._op_binbytes,
    "BINBYTES8": Reader._op_binbytes,
    "BYTEARRAY8": Reader._op_binbytes,
    "NONE": Reader._op_none,
    "NEWTRUE": Reader._op_newtrue,
    "NEWFALSE": Reader._op_newfalse,
    "NEXT_BUFFER": Reader._op_next_buffer,
    "READONLY_BUFFER": Reader._op_next_buffer,
    "EMPTY_LIST": Reader._op_empty_list,
    "EMPTY_TUPLE": Reader._op_empty_tuple,
    "EMPTY_DICT": Reader._op_empty_dict,
    "EMPTY_SET": Reader._op_empty_set,
    "LIST": Reader._op_list,
    "TUPLE": Reader._op_tuple,
    "TUPLE1": Reader._op_tuple1,
    "TUPLE2": Reader._op_tuple1,
    "TUPLE3": Reader._op_tuple1,
    "DICT": Reader._op_dict,
    "FROZENSET": Reader._op_frozenset,
    "APPEND": Reader._op_append,
    "APPENDS": Reader._op_append,
    "SETITEM": Reader._op_setitem,
    "SETITEMS": Reader._op_setitem,
    "ADDITEMS": Reader._op_additems,
    "POP": Reader._op_pop,
    "POP_MARK": Reader._op_pop_mark,
    "DUP": Reader._op_dup,
    "PUT": Reader._op_put,
    "BINPUT": Reader._op_put,
    "LONG_BINPUT": Reader._op_put,
    "MEMOIZE": Reader._op_put,
    "GET": Reader._op_get,
    "BINGET": Reader._op_get,
    "LONG_BINGET": Reader._op_get,
    "GLOBAL": Reader._op_global,
    "STACK_GLOBAL": Reader._op_stack_global,
    "INST": Reader._op_inst,
    "OBJ": Reader._op_obj,
    "NEWOBJ": Reader._op_newobj,
    "NEWOBJ_EX": Reader._op_newobj_ex,
    "REDUCE": Reader._op_reduce,
    "BUILD": Reader._op_build,
    "EXT1": Reader._op_ext1,
    "EXT2": Reader._op_ext1,
    "EXT4": Reader._op_ext1,
    "PERSID": Reader._op_persid,
    "BINPERSID": Reader._op_binpersid,
}


_SCALAR = (str, bytes, int, float, Global, type(None))


def _python3_name(k: Any) -> Any:
    """A global as the unpickler imports it: a Python 2 name (``__builtin__.object``) is fixed to
    its Python 3 one (``builtins.object``, one key with it) by pickle's own tables (fix_imports)."""
    if not isinstance(k, Global):
        return k
    module, name = NAME_MAPPING.get((k.module, k.name), (IMPORT_MAPPING.get(k.module, k.module), k.name))
    return Global(module, name)


def _constant(k: Any) -> bool:
    """A key whose equality and hash are Python's own: a constant, a global, or a short flat tuple of
    them (a long or nested one would cost its size at every insert: a memoized one, quadratic)."""
    if isinstance(k, tuple):
        return len(k) <= 8 and all(isinstance(x, _SCALAR) for x in k)
    return isinstance(k, _SCALAR)


def _init_list(c: Call) -> list[Any]:
    c.list_items = []
    return c.list_items
