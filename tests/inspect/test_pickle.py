"""Static pickle reader: nothing imported or called; every trick is a typed finding."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest

from ckptgate.inspect import inspect_tree
from ckptgate.inspect.pickle import PickleLimits, read_pickle
from ckptgate.inspect.torchzip import walk_value

from ckpt_inspect_helpers import p_str, write


def _codes(data: bytes, context: str = "tensors", **kw: object) -> list[str]:
    return [f.code for f in read_pickle(data, path="p", context=context, **kw).findings]


class _Canary:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (exec, (f"open({self.path!r}, 'w').write('pwned')",))


def test_canary_pickle_is_reported_and_never_executed(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    root = tmp_path / "ck"
    write(root, "pytorch_model.bin", pickle.dumps({"w": _Canary(str(canary))}, protocol=2))
    insp = inspect_tree(root)
    codes = {f.code for f in insp.findings}
    assert {"pickle.global_not_allowed", "classify.raw_pickle", "classify.extension_mismatch"} <= codes
    assert not insp.clean
    assert not canary.exists()


@pytest.mark.parametrize("proto", [0, 1, 2, 3, 4, 5])
def test_all_protocols_read_statically(proto: int, tmp_path: Path) -> None:
    blob = [b"y"] if proto >= 3 else []  # protocols 0-2 pickle bytes through _codecs.encode
    data = pickle.dumps({"a": [1, 2.5, "x", None, True, *blob], "t": (1, 2)}, protocol=proto)
    r = read_pickle(data, path="p")
    assert r.complete and r.inside_allowlist and r.findings == ()


def test_stack_global_from_memo_is_resolved_and_refused() -> None:
    data = (b"\x80\x04" + b"\x8c\x02os\x94" + b"\x8c\x06system\x94" + b"00" + b"h\x00h\x01\x93"
            + b"\x8c\x04echo\x85R.")
    r = read_pickle(data, path="p")
    assert [f.code for f in r.findings] == ["pickle.global_not_allowed"]
    assert r.globals == ("os.system",)
    assert [c.target for c in r.calls] == ["os.system"]


def test_stack_global_from_computed_value_is_unresolved() -> None:
    data = b"\x80\x04ccollections\nOrderedDict\n)R\x8c\x06system\x93)R."
    codes = _codes(data)
    assert codes[0] == "pickle.unresolved_global"
    assert "pickle.call_target_unresolved" in codes


def test_binget_of_missing_memo_key() -> None:
    assert _codes(b"\x80\x02h\x07.") == ["pickle.memo_missing"]


@pytest.mark.parametrize("ext", [b"\x82\x01", b"\x83\x01\x00", b"\x84\x01\x00\x00\x00"])
def test_ext_opcodes_are_findings(ext: bytes) -> None:
    r = read_pickle(b"\x80\x02" + ext + b")R.", path="p")
    codes = [f.code for f in r.findings]
    assert codes[0] == "pickle.extension_code"
    assert not r.inside_allowlist


def test_nested_pickle_in_bytes() -> None:
    inner = pickle.dumps({"x": 1}, protocol=4)
    data = b"\x80\x04C" + bytes([len(inner)]) + inner + b"."
    assert _codes(data) == ["pickle.nested_pickle"]


def test_findings_before_a_corrupt_tail_are_kept() -> None:
    data = b"\x80\x02cos\nsystem\n" + p_str("id") + b"\x85R" + b"\xff\xfe garbage"
    codes = _codes(data)
    assert codes[0] == "pickle.global_not_allowed"
    assert codes[-1] == "pickle.malformed"


def test_misplaced_and_duplicated_proto() -> None:
    assert _codes(b"N\x80\x02.") == ["pickle.proto_misplaced"]
    assert _codes(b"\x80\x02\x80\x02N.") == ["pickle.proto_misplaced"]


def test_trailing_data_after_stop() -> None:
    assert _codes(b"\x80\x02N.EXTRA") == ["pickle.trailing_data"]


def test_huge_frame_length() -> None:
    assert _codes(b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N.") == ["pickle.frame_too_large"]


def test_huge_binbytes8_length_is_malformed_not_allocated() -> None:
    assert _codes(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"xx.") == ["pickle.malformed"]


TRAMPOLINES = ["pkgutil resolve_name", "importlib import_module", "operator attrgetter", "_operator getitem",
               "functools partial", "pip main", "marshal loads", "types FunctionType", "codeop compile_command",
               "uuid _get_command_stdout", "timeit timeit", "asyncio.unix_events _UnixSubprocessTransport",
               "_posixsubprocess fork_exec", "picklescan.scanner scan_pickle_bytes", "torch load",
               "pickle loads", "builtins getattr", "builtins eval", "subprocess Popen", "runpy _run_code"]


@pytest.mark.parametrize("target", TRAMPOLINES)
def test_trampolines_are_outside_the_allowlist(target: str) -> None:
    data = b"\x80\x02c" + target.replace(" ", "\n").encode() + b"\n" + p_str("x") + b"\x85R."
    r = read_pickle(data, path="p")
    assert [f.code for f in r.findings] == ["pickle.global_not_allowed"]
    assert not r.inside_allowlist


@pytest.mark.parametrize("op", [b"\x81", b"R", b"o", b"i"])
def test_calls_to_non_allowlisted_callables_even_when_popped(op: bytes) -> None:
    if op == b"i":
        body = b"(" + b"ibuiltins\nprint\n0"
    elif op == b"o":
        body = b"(cbuiltins\nprint\no0"
    else:
        body = b"cbuiltins\nprint\n)" + op + b"0"
    r = read_pickle(b"\x80\x02" + body + b"N.", path="p")
    assert "pickle.global_not_allowed" in [f.code for f in r.findings]
    assert "builtins.print" in [c.target for c in r.calls]


def test_newobj_ex_and_build_on_unknown_class() -> None:
    data = b"\x80\x04cevil\nThing\n)}\x92}b."
    r = read_pickle(data, path="p")
    assert [f.code for f in r.findings] == ["pickle.global_not_allowed"]
    assert [c.opcode for c in r.calls] == ["NEWOBJ_EX", "BUILD"]


def test_setitem_on_non_dict() -> None:
    assert _codes(b"\x80\x02ctorch\nSize\n)RK\x01K\x02s.") == ["pickle.setitem_non_dict"]


def test_build_on_non_object() -> None:
    assert _codes(b"\x80\x02}}b.") == ["pickle.build_non_object"]


def test_allowlisted_global_used_as_callable_only_when_allowed() -> None:
    assert _codes(b"\x80\x02ctorch\nfloat32\n)R.") == ["pickle.call_not_allowed"]


def test_context_allowlists_are_separate() -> None:
    data = b"\x80\x02cpathlib\nPosixPath\n" + p_str("x") + b"\x85R."
    assert _codes(data, "dcp_metadata") == []
    assert _codes(data, "tensors") == ["pickle.global_not_allowed"]


def test_op_and_memo_caps() -> None:
    data = b"\x80\x02" + b"N0" * 1000 + b"N."
    assert _codes(data, limits=PickleLimits(max_ops=100)) == ["pickle.op_limit"]
    data = b"\x80\x04" + b"N\x940" * 100 + b"N."
    assert _codes(data, limits=PickleLimits(max_memo=10)) == ["pickle.memo_limit"]


def test_memo_expansion_is_refused_before_any_walk() -> None:
    """2**60 nodes as a tree: measured in time linear in the graph and refused (tests/inspect/test_budget.py)."""
    body = b"\x80\x04]\x940" + b"0".join(b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94" for i in range(60))
    r = read_pickle(body + b".", path="p")
    assert [f.code for f in r.findings] == ["inspect.work_budget"]
    assert not r.inside_allowlist and r.value is None


def test_walks_stop_at_their_node_budget() -> None:
    r = read_pickle(b"\x80\x02](" + b"N" * 100 + b"e.", path="p")
    assert r.tree_units >= 101
    assert walk_value(r.value, lambda p, v: False, max_nodes=50) is False
    assert walk_value(r.value, lambda p, v: False, max_nodes=r.tree_units) is True


def test_pickle_without_stop() -> None:
    assert _codes(b"\x80\x02N") == ["pickle.no_stop"]


def test_stack_underflow_and_missing_mark() -> None:
    assert _codes(b"\x80\x02R.") == ["pickle.stack_underflow"]
    assert _codes(b"\x80\x02t.") == ["pickle.mark_missing"]


@pytest.mark.parametrize("data", [b"\x80\x02K\x01\x86.", b"\x80\x02\x85.", b"\x80\x02K\x01K\x02\x87."])
def test_short_stack_under_tuple1_2_3_is_an_underflow(data: bytes) -> None:
    """pickle itself refuses these; the static reader must not call them clean."""
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(data)
    rep = read_pickle(data, path="x", context="tensors")
    assert [f.code for f in rep.findings] == ["pickle.stack_underflow"]
    assert not rep.complete and not rep.inside_allowlist


def test_oversized_pickle_is_refused() -> None:
    assert _codes(b"\x80\x02N.", limits=PickleLimits(max_bytes=2)) == ["pickle.too_large"]


@pytest.mark.parametrize("name", ["model.bin", "weights.pt", "model.safetensors", "config.json", "noext"])
def test_plain_pickle_under_any_name(name: str, tmp_path: Path) -> None:
    write(tmp_path, name, pickle.dumps({"w": [1, 2, 3]}, protocol=0 if name.endswith(".json") else 4))
    insp = inspect_tree(tmp_path)
    codes = {f.code for f in insp.findings}
    assert "classify.raw_pickle" in codes
    assert ("classify.extension_mismatch" in codes) == (name != "noext")
    assert insp.files[0].kind == "pickle"
    assert os.path.exists(tmp_path / name)


def test_a_reader_crash_is_a_reject_not_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckptgate.inspect.files as files

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("scanner crashed")

    monkeypatch.setattr(files, "read_pickle", boom)
    write(tmp_path, ".metadata", pickle.dumps({"x": 1}, protocol=4))
    insp = inspect_tree(tmp_path)
    assert "inspect.reader_failed" in {f.code for f in insp.findings} and not insp.clean


def test_huge_sparse_pickle_is_refused_unread(tmp_path: Path) -> None:
    p = tmp_path / ".metadata"
    p.write_bytes(b"\x80\x04")
    with open(p, "r+b") as f:
        f.truncate(1 << 40)
    insp = inspect_tree(tmp_path)
    assert "pickle.too_large" in {f.code for f in insp.findings} and not insp.clean


def _long4(n: int) -> bytes:
    b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(b)) + b


@pytest.mark.parametrize("n", [10**6000, -(10**6000), 1 << 2048], ids=["huge", "negative", "just_over"])
def test_integer_wider_than_the_cap_is_a_finding_not_a_value(n: int, tmp_path: Path) -> None:
    """An int Python refuses to print (over 4300 digits) never reaches a repr, an f-string or the
    JSON report: a dict key of one was pickle.malformed, a tensor's shape or offset exit 1."""
    data = b"\x80\x02}" + _long4(n) + b"K\x01s."
    rep = read_pickle(data, path="p")
    assert [f.code for f in rep.findings] == ["pickle.int_too_large"]
    assert rep.complete and not rep.inside_allowlist
    ok = b"\x80\x02}" + _long4((1 << 2047) - 1) + b"K\x01s."  # the widest LONG1 could hold, and more
    assert _codes(ok) == []
    from ckpt_inspect_helpers import p_int, p_tuple, torch_zip

    off = _long4(n) if n > 0 else p_int(0)
    t = (
        b"ctorch._utils\n_rebuild_tensor_v2\n((" + p_str("storage") + b"ctorch\nFloatStorage\n" + p_str("0")
        + p_str("cpu") + p_int(1) + b"tQ" + off + b"(" + p_int(0) + _long4(abs(n)) + b"t" + p_tuple([1, 1])
        + b"\x89ccollections\nOrderedDict\n)RtR"
    )  # fmt: skip
    (tmp_path / "ck").mkdir()
    torch_zip(tmp_path / "ck" / "pytorch_model.bin", b"\x80\x02}(" + p_str("w") + t + b"u.", {"0": b"\0" * 4})
    insp = inspect_tree(tmp_path / "ck")
    assert "pickle.int_too_large" in {f.code for f in insp.findings}
    json.dumps(insp.to_facts())


# -- constants whose value depends on the unpickler ------------------------------------------------
@pytest.mark.parametrize(
    ("text", "c_value", "genops_value"),
    [
        (b"I010\n", 8, 10),  # strtol(s, 0): a leading 0 is octal
        (b"I-0777\n", -511, -777),
        (b"I 010\n", 8, 10),
        (b"I+1\n", True, 1),  # any 0/1 of three bytes is a bool to C, an int to genops
        (b"I-0\n", False, 0),
    ],
)
def test_text_int_that_cpython_reads_otherwise_is_ambiguous(text: bytes, c_value: object, genops_value: object) -> None:
    """torch.load's C unpickler and pickletools disagree on these INT spellings, which the pickler
    never writes: a tensor's shape (10,) to the reader was (8,) to torch.  Not read as either."""
    data = b"\x80\x02" + text + b"."
    assert type(pickle.loads(data)) is type(c_value) and pickle.loads(data) == c_value
    import pickletools

    assert [a for _op, a, _p in pickletools.genops(data)][1] == genops_value
    rep = read_pickle(data, path="p")
    assert [f.code for f in rep.findings] == ["pickle.ambiguous_literal"]
    assert rep.complete and not rep.inside_allowlist and rep.value is not genops_value


@pytest.mark.parametrize(
    "text",
    [b"I0\n", b"I00\n", b"I01\n", b"I10\n", b"I-7\n", b"I2147483648\n", b"L0L\n", b"L-987654321098765L\n", b"L7\n"],
)
def test_text_int_as_the_pickler_writes_it_is_read(text: bytes) -> None:
    data = b"\x80\x02" + text + b"."
    rep = read_pickle(data, path="p")
    assert rep.findings == () and rep.inside_allowlist
    assert rep.value == pickle.loads(data) and type(rep.value) is type(pickle.loads(data))


@pytest.mark.parametrize("op", [b"U\x03w\xc3\xa9", b"T\x03\x00\x00\x00w\xc3\xa9"], ids=["SHORT_BINSTRING", "BINSTRING"])
def test_non_ascii_python2_string_is_ambiguous(op: bytes) -> None:
    """pickletools decodes str8 bytes as latin-1 ('wÃ©'), torch.load as UTF-8 ('wé'): a key the
    reader saw beside 'wé' was the same key to torch, which kept only the last tensor."""
    data = b"\x80\x02" + op + b"."
    assert pickle.loads(data, encoding="utf-8") == "w\u00e9"
    assert read_pickle(data.replace(op, op.replace(b"w\xc3\xa9", b"wab")), path="p").findings == ()
    rep = read_pickle(data, path="p")
    assert [f.code for f in rep.findings] == ["pickle.ambiguous_literal"]
    assert not rep.inside_allowlist


def test_ambiguous_shape_in_a_torch_zip_is_not_clean(tmp_path: Path) -> None:
    """A tensor whose size is written ``I010``: torch.load builds shape (8,), the reader read (10,)
    and called the file clean plain tensors (static_pickle), so the published tensor was not the
    one torch loads."""
    from ckpt_inspect_helpers import p_int, torch_zip

    t = (
        b"ctorch._utils\n_rebuild_tensor_v2\n((" + p_str("storage") + b"ctorch\nFloatStorage\n" + p_str("0")
        + p_str("cpu") + p_int(10) + b"tQ" + p_int(0) + b"(I010\nt(" + p_int(1) + b"t"
        + b"\x89ccollections\nOrderedDict\n)RtR"
    )  # fmt: skip
    (tmp_path / "ck").mkdir()
    torch_zip(tmp_path / "ck" / "pytorch_model.bin", b"\x80\x02}(" + p_str("w") + t + b"u.", {"0": b"\0" * 40})
    insp = inspect_tree(tmp_path / "ck")
    assert "pickle.ambiguous_literal" in {f.code for f in insp.findings}
    assert not insp.clean



_ONE = b"K\x01"
_TUPLE = b"K\x01N\x86"  # (1, None)


@pytest.mark.parametrize(
    ("k1", "k2"),
    [
        (p_str("w"), p_str("w")),
        (_ONE, b"\x88"),  # 1 and True are one key
        (_ONE, b"G?\xf0\x00\x00\x00\x00\x00\x00"),  # 1 and 1.0
        (_TUPLE, _TUPLE),
        (b"ctorch\nfloat32\n", b"ctorch\nfloat32\n"),
    ],
    ids=["str", "int_bool", "int_float", "tuple", "global"],
)
@pytest.mark.parametrize("build", ["setitems", "dict", "setitem", "ordered_dict"])
def test_a_repeated_dict_key_is_refused(k1: bytes, k2: bytes, build: str) -> None:
    """The unpickler keeps the last value of a key that repeats; the reader listed each, so a state
    dict {'w': A, 'w': B} was two tensors 'w' to inspection and B alone to torch.load."""
    v1, v2 = b"K\x07", b"K\x08"
    data = {
        "setitems": b"\x80\x02}(" + k1 + v1 + k2 + v2 + b"u.",
        "dict": b"\x80\x02(" + k1 + v1 + k2 + v2 + b"d.",
        "setitem": b"\x80\x02}" + k1 + v1 + b"s" + k2 + v2 + b"s.",
        "ordered_dict": b"\x80\x02ccollections\nOrderedDict\n)R(" + k1 + v1 + b"u(" + k2 + v2 + b"u.",
    }[build]
    loaded = pickle.loads(data.replace(b"ctorch\nfloat32\n", b"cbuiltins\nint\n"))  # constants and OrderedDict
    assert list(loaded.values()) == [8]
    rep = read_pickle(data, path="p", context="dcp_metadata")
    assert [f.code for f in rep.findings] == ["pickle.duplicate_key"]
    assert not rep.inside_allowlist and rep.value is None
    other = read_pickle(data.replace(k2 + v2, p_str("z") + v2), path="p", context="dcp_metadata")
    assert other.findings == () and other.inside_allowlist


def test_symbolic_and_long_tuple_keys_are_not_compared() -> None:
    """Two calls' results may or may not be equal to the unpickler: not compared (nor refused here).
    A long tuple key is not hashed at every insert (a memoized one would make that quadratic)."""
    size = b"ctorch\nSize\n(K\x01tR"
    data = b"\x80\x02}(" + size + b"K\x07" + size + b"K\x08u."
    assert read_pickle(data, path="p").findings == ()
    long_key = b"(" + b"K\x01" * 9 + b"t"
    assert read_pickle(b"\x80\x02}(" + long_key + b"K\x07" + long_key + b"K\x08u.", path="p").findings == ()


@pytest.mark.parametrize(
    ("call", "loaded"),
    [
        (b"ccollections\nOrderedDict\n(](" + p_str("hidden") + b"K\x01tatR", {"hidden": 1}),  # REDUCE: pairs
        (b"(ccollections\nOrderedDict\n](" + p_str("hidden") + b"K\x01tao", {"hidden": 1}),  # OBJ
        (b"ccollections\nOrderedDict\n)}(" + p_str("hidden") + b"K\x01u\x92", {}),  # NEWOBJ_EX: __new__ drops them
    ],
    ids=["reduce", "obj", "newobj_ex"],
)
def test_an_ordered_dict_built_from_arguments_is_refused(call: bytes, loaded: dict[str, int]) -> None:
    """The pickler writes OrderedDict() and SETITEMS; one built from arguments holds items that
    torch.load (weights_only too) loads and no walk of its items saw: a tensor inside was missing
    from a clean torch zip's layout."""
    data = b"\x80\x04}(" + p_str("inner") + call + b"u."
    assert pickle.loads(data)["inner"] == loaded  # noqa: S301 - OrderedDict and constants only
    rep = read_pickle(data, path="p")
    assert [f.code for f in rep.findings] == ["pickle.container_args"]
    assert not rep.inside_allowlist
    empty = b"\x80\x02}(" + p_str("inner") + b"ccollections\nOrderedDict\n)R(" + p_str("x") + b"K\x01uu."
    assert read_pickle(empty, path="p").findings == ()


def test_a_tensor_in_an_ordered_dict_s_arguments_is_not_clean(tmp_path: Path) -> None:
    from ckpt_inspect_helpers import p_tensor, torch_zip

    inner = b"ccollections\nOrderedDict\n(](" + p_str("hidden") + p_tensor("0", 3, (3,), (1,)) + b"tatR"
    (tmp_path / "ck").mkdir()
    torch_zip(tmp_path / "ck" / "pytorch_model.bin", b"\x80\x02}(" + p_str("inner") + inner + b"u.", {"0": b"\0" * 12})
    insp = inspect_tree(tmp_path / "ck")
    assert "pickle.container_args" in {f.code for f in insp.findings}
    assert not insp.clean


def _storage(key: str) -> bytes:
    from ckpt_inspect_helpers import p_int

    return b"(" + p_str("storage") + b"ctorch\nFloatStorage\n" + p_str(key) + p_str("cpu") + p_int(4) + b"tQ"


def _v2(extra: bytes = b"") -> bytes:
    from ckpt_inspect_helpers import p_int, p_tuple

    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + _storage("0") + p_int(0) + p_tuple((4,)) + p_tuple((1,))
            + b"\x89ccollections\nOrderedDict\n)R" + extra + b"tR")  # fmt: skip


def _from_type(state: bytes) -> bytes:
    return b"ctorch._tensor\n_rebuild_from_type_v2\n(" + b"ctorch._utils\n_rebuild_tensor_v2\nctorch\nTensor\n(" + (
        _v2()[len(b"ctorch._utils\n_rebuild_tensor_v2\n(") : -2] + b"t" + state + b"tR"
    )


_NEG = b"}(" + p_str("neg") + b"\x88u"
_FROM_TYPE = b"ctorch._tensor\n_rebuild_from_type_v2\n"


def _from_type_of(rebuild: bytes, state: bytes = b"}") -> bytes:
    """``_rebuild_from_type_v2(f, Tensor, args, state)`` for the REDUCE ``rebuild`` = ``f(*args)``."""
    func, args = rebuild[: rebuild.index(b"\n", rebuild.index(b"\n") + 1) + 1], rebuild.rsplit(b"R", 1)[0]
    return _FROM_TYPE + b"(" + func + b"ctorch\nTensor\n" + args[len(func) :] + state + b"tR"


_SET_STORAGE_1 = b"(" + _storage("1") + b"K\x00(K\x04t(K\x01ttb"  # BUILD: Tensor.set_(storage 1, 0, (4,), (1,))


@pytest.mark.parametrize(
    ("tensor", "torch_sees"),
    [
        (_v2() + _SET_STORAGE_1, [6.0] * 4),  # BUILD re-points the tensor at storage 1
        (_v2() + b")b", []),  # an empty state: Tensor.set_(), an empty tensor
        (_v2() + b"}b", []),
        (_v2(b"}(" + p_str("neg") + b"\x88u"), [-1.0, -2.0, -3.0, -4.0]),  # metadata: the neg bit
        (_from_type(b"}(" + p_str("data") + _v2().replace(b"0X\x03", b"1X\x03") + b"u"), [6.0] * 4),  # setattr data
        (_from_type_of(_v2(_NEG)), [-1.0, -2.0, -3.0, -4.0]),  # the metadata of the rebuild it calls
        (b"ctorch._utils\n_rebuild_parameter\n(" + _from_type_of(_v2(_NEG)) + b"\x89ccollections\nOrderedDict\n)RtR",
         [-1.0, -2.0, -3.0, -4.0]),
    ],
    ids=["build_set_", "build_empty_tuple", "build_empty_dict", "metadata_neg", "from_type_state_data", "from_type_inner_metadata", "parameter_of_it"],
)
def test_state_torch_applies_to_a_rebuilt_tensor_is_refused(tensor: bytes, torch_sees: list[float],
                                                             tmp_path: Path) -> None:
    """torch.load (weights_only=True too) applies these to the tensor it rebuilt, and the layout read
    storage 0's bytes [1, 2, 3, 4] alone: each was a clean static_pickle torch zip whose published
    tensor was not the one torch loads."""
    import struct

    import torch
    from ckpt_inspect_helpers import torch_zip

    (tmp_path / "ck").mkdir()
    f = torch_zip(tmp_path / "ck" / "pytorch_model.bin", b"\x80\x02}(" + p_str("w") + tensor + b"u.",
                  {"0": struct.pack("<4f", 1, 2, 3, 4), "1": struct.pack("<4f", 6, 6, 6, 6)})  # fmt: skip
    assert torch.load(f, weights_only=True)["w"].tolist() == torch_sees
    insp = inspect_tree(tmp_path / "ck")
    assert "pickle.tensor_state" in {x.code for x in insp.findings} and not insp.clean


@pytest.mark.parametrize("state", [b"N", b"}", b"}(" + p_str("ds_id") + p_str("0_11") + b"u", b"(}Nt"])
def test_a_subclass_state_producers_write_is_read(state: bytes) -> None:
    data = b"\x80\x02}(" + p_str("w") + _from_type(state) + b"u."
    assert read_pickle(data, path="p").findings == ()
    bad = data.replace(p_str("ds_id") + p_str("0_11"), p_str("ds_id") + b"K\x01")
    assert bad == data or [f.code for f in read_pickle(bad, path="p").findings] == ["pickle.tensor_state"]


def test_a_rebuild_inside_a_rebuild_is_followed_as_far_as_producers_nest() -> None:
    """``_rebuild_from_type_v2`` calls the rebuild it names with the arguments it holds: their
    metadata is applied as if the pickle had called it.  One level of nesting is read; a chain
    deeper than any producer writes is not followed (each level would be walked at every call)."""
    inner = _v2()
    for _ in range(2):
        inner = _from_type_of(inner)
    assert read_pickle(b"\x80\x02}(" + p_str("w") + inner + b"u.", path="p").findings == ()
    for _ in range(4):
        inner = _from_type_of(inner)
    rep = read_pickle(b"\x80\x02}(" + p_str("w") + inner + b"u.", path="p")
    assert "pickle.tensor_state" in [f.code for f in rep.findings]


def test_a_python2_name_and_its_python3_name_are_one_key() -> None:
    """A protocol 2 pickle's ``__builtin__.object`` is imported as ``builtins.object`` (fix_imports):
    {builtins.object: A, __builtin__.object: B} was two keys to a DeepSpeed file's reader, and
    the one key object, holding B, to torch.load (weights_only=False, as DeepSpeed loads)."""
    data = b"\x80\x02}(cbuiltins\nobject\nK\x07c__builtin__\nobject\nK\x08u."
    assert pickle.loads(data) == {object: 8}  # noqa: S301 - object and constants only
    rep = read_pickle(data, path="p", context="deepspeed")
    assert [f.code for f in rep.findings] == ["pickle.duplicate_key"]
    fine = read_pickle(data.replace(b"c__builtin__\nobject\n", p_str("x")), path="p", context="deepspeed")
    assert fine.findings == ()
