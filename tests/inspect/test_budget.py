"""Work budgets: refusing any pickle costs work units bounded by its bytes, per file and per intake.

Every assertion is on work units (opcodes decoded, graph edges measured, tree nodes), never on time.
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest

from ckptgate.errors import InputRejected
from ckptgate.inspect import inspect_tree
from ckptgate.inspect.budget import FileWork, WorkBudget, WorkLimits
from ckptgate.inspect.pickle import PickleLimits, read_pickle
from ckptgate.inspect.walk import WalkLimits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
C = 4  # work units per byte any refusal below may take, at most


def laughs(depth: int = 30, width: int = 10) -> bytes:
    """A list holding ``width`` references to the list below it, ``depth`` times: 10**30 nodes as a tree."""
    out = bytearray(b"\x80\x02]q\x00")
    for i in range(1, depth + 1):
        out += b"0](" + (b"h" + bytes([i - 1])) * width + b"eq" + bytes([i])
    return bytes(out + b".")


def torch_zip(pkl: bytes) -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")
    return b.getvalue()


def _codes(rep) -> list[str]:
    return [f.code for f in rep.findings]


def _budget_finding(rep):
    [f] = [f for f in rep.findings if f.code == "inspect.work_budget"]
    return f


def test_billion_laughs_is_refused_within_c_units_per_byte() -> None:
    data = laughs()
    rep = read_pickle(data, path="p")
    f = _budget_finding(rep)
    assert f.evidence["budget"] == "file" and f.evidence["limit"] == WorkLimits().file_limit(len(data))
    assert not rep.inside_allowlist and rep.value is None
    assert rep.work <= C * len(data)


def test_a_refused_stream_is_charged_its_whole_budget() -> None:
    data = laughs()
    w = FileWork("p", len(data))
    read_pickle(data, path="p", work=w)
    assert w.done <= C * len(data) and w.used == w.limit + 1


def test_an_expansion_just_inside_the_budget_is_kept_and_measured() -> None:
    data = laughs(depth=3, width=10)  # 1 + 10 + 100 + 1000 lists
    rep = read_pickle(data, path="p")
    assert rep.findings == () and rep.complete and rep.value is not None
    # 1,111 nodes, plus their paths ("i.j.k": 2 bytes a level) in 64-byte blocks
    assert rep.tree_units == 1111 + (10 * 2 + 100 * 4 + 1000 * 6) // 64
    small = read_pickle(data, path="p", work=FileWork("p", len(data), WorkLimits(file_base=100, file_per_byte=1)))
    f = _budget_finding(small)
    assert small.value is None and f.evidence["needs_at_least"] + f.evidence["used"] > f.evidence["limit"] == 184


def test_shared_tuples_are_refused_without_expanding_them() -> None:
    """TUPLE2 of a memoised tuple with itself, 60 times: 2**60 nodes; also a tuple key repr'd."""
    body = b"\x80\x04]\x940" + b"0".join(b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94" for i in range(60))
    data = body + b"."
    rep = read_pickle(data, path="p")
    assert _codes(rep) == ["inspect.work_budget"] and rep.work <= C * len(data)
    # the same value as a dict key, and as the target of an error message (its repr is not built)
    keyed = body + b"}\x94h\x3c" + b"N" + b"s" + b"0" + b"h\x3cN" + b"b."
    rep = read_pickle(keyed, path="p")
    assert "pickle.build_non_object" in _codes(rep) and rep.work <= C * len(keyed)


def test_repeated_big_strings_count_at_every_place_they_appear() -> None:
    """One 64 KiB string, referenced 5,000 times from a list: 320 MB of strings as a tree."""
    s = b"x" * (64 << 10)
    data = b"\x80\x02X" + struct.pack("<I", len(s)) + s + b"q\x00" + b"0](" + b"h\x00" * 5000 + b"e."
    rep = read_pickle(data, path="p")
    assert _codes(rep) == ["inspect.work_budget"] and rep.work <= C * len(data)


def test_repeated_big_keys_count_in_every_path() -> None:
    """A 64 KiB key under which 5,000 entries sit: every path below it repeats the key."""
    s = b"k" * (64 << 10)
    inner = b"](" + b"N" * 5000 + b"e"
    data = b"\x80\x02}X" + struct.pack("<I", len(s)) + s + inner + b"s."
    rep = read_pickle(data, path="p")
    assert _codes(rep) == ["inspect.work_budget"] and rep.work <= C * len(data)


def test_deep_nesting_is_refused() -> None:
    depth = 1000
    data = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    rep = read_pickle(data, path="p")
    assert _codes(rep) == ["pickle.too_deep"] and rep.value is None
    assert rep.work <= C * len(data)
    ok = b"\x80\x02" + b"]" * 50 + b"a" * 49 + b"."
    assert read_pickle(ok, path="p").findings == ()


def test_a_value_that_contains_itself_is_refused() -> None:
    data = b"\x80\x02]q\x00h\x00a."
    rep = read_pickle(data, path="p")
    assert _codes(rep) == ["pickle.cyclic_value"] and rep.value is None


@pytest.mark.parametrize("op", [b"a", b"s"])
def test_long_append_and_setitem_runs_cost_units_linear_in_bytes(op: bytes) -> None:
    """200,000 items: work linear in the bytes (and accepted: a long list is no attack)."""
    n = 200_000
    if op == b"a":
        data = b"\x80\x02](" + b"K\x01" * n + b"e."
    else:
        data = b"\x80\x02}(" + b"J" + b"".join(struct.pack("<i", i) + b"K\x01J" for i in range(n))[:-1] + b"u."
    rep = read_pickle(data, path="p")
    assert rep.findings == () and rep.work <= C * len(data)


def test_long_build_runs_add_one_call_site_each_kind() -> None:
    """BUILD after BUILD on one object: the inventory (and the policy input) keeps one entry."""
    data = b"\x80\x02ccollections\nOrderedDict\n)R" + b"}b" * 50_000 + b"."
    rep = read_pickle(data, path="p")
    assert [(c.opcode, c.target) for c in rep.calls] == [("REDUCE", "collections.OrderedDict"),
                                                           ("BUILD", "collections.OrderedDict")]
    assert len(str(rep.to_json())) < 1000


def test_opcodes_beyond_the_file_budget_are_refused_while_reading() -> None:
    data = b"\x80\x02" + b"N0" * 100_000 + b"N."
    w = FileWork("p", len(data), WorkLimits(file_base=1, file_per_byte=1))
    w.limit = 5_000  # as if the stream were tiny
    rep = read_pickle(data, path="p", work=w)
    assert _codes(rep) == ["inspect.work_budget"] and rep.work <= 5_000 + 1024


def _tree(tmp_path: Path, n: int, payload: bytes) -> Path:
    root = tmp_path / f"ckpt{n}"
    root.mkdir()
    for i in range(n):
        (root / f"m{i}.pt").write_bytes(payload)
    return root


def test_one_billion_laughs_torch_zip_is_a_file_budget_finding(tmp_path: Path) -> None:
    ins = inspect_tree(_tree(tmp_path, 1, torch_zip(laughs())))
    [f] = [f for f in ins.findings if f.code == "inspect.work_budget"]
    assert f.evidence["budget"] == "file" and not ins.clean
    assert ins.pickles[0].work <= C * len(laughs())


@pytest.mark.parametrize("n", [4, 200])
def test_many_copies_hit_the_whole_intake_budget(tmp_path: Path, n: int) -> None:
    zipped = torch_zip(laughs())
    root = _tree(tmp_path, n, zipped)
    limits = WorkLimits()
    with pytest.raises(InputRejected) as e:
        inspect_tree(root)
    assert e.value.code == "input.work_budget" and e.value.evidence["budget"] == "intake"
    limit = limits.intake_limit(n * len(zipped))
    assert e.value.evidence["limit"] == limit
    # refused as soon as the charges pass the limit: at most one more file's budget is spent
    assert e.value.evidence["used"] <= limit + limits.file_limit(len(laughs())) + 1


def test_the_work_limits_are_configurable_like_the_other_limits(tmp_path: Path) -> None:
    root = _tree(tmp_path, 4, torch_zip(laughs()))
    generous = WalkLimits(work=WorkLimits(intake_base=10**9))
    ins = inspect_tree(root, limits=generous)  # each file refused on its own; the intake goes on
    assert sum(f.code == "inspect.work_budget" for f in ins.findings) == 4
    assert all(p.value is None for p in ins.pickles)
    with pytest.raises(ValueError):
        WorkLimits(file_per_byte=0)
    with pytest.raises(ValueError):
        WalkLimits(work=None)  # type: ignore[arg-type]


def test_the_intake_budget_is_shared_and_names_itself() -> None:
    b = WorkBudget(WorkLimits(intake_base=10, intake_per_byte=1), total_bytes=5)
    f1, f2 = b.file("a", 0), b.file("b", 0)
    assert f1.charge(10) and b.used == 10
    with pytest.raises(InputRejected) as e:
        f2.charge(6)
    assert e.value.evidence == {"budget": "intake", "limit": 15, "used": 16, "path": "b"}


@pytest.mark.parametrize("fixture", sorted(p.parent.name for p in FIXTURES.glob("*/checkpoint")))
def test_clean_real_fixtures_stay_well_inside_both_budgets(fixture: str) -> None:
    root = FIXTURES / fixture / "checkpoint"
    limits = WorkLimits()
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    ins = inspect_tree(root)
    assert not any(f.code in ("inspect.work_budget", "pickle.too_deep", "pickle.cyclic_value") for f in ins.findings)
    for p in ins.pickles:
        # a pickle inside a file's item (``__0_0.distcp#common_state/shard_0_1``, megatron-core 0.19's
        # common state) is bounded by that file: its size is the most the item can have
        nbytes = (root / p.path.split("#", 1)[0]).stat().st_size
        if "#" not in p.path and zipfile.is_zipfile(root / p.path):  # a torch zip: the budget is data.pkl's
            with zipfile.ZipFile(root / p.path) as z:
                nbytes = next(i.file_size for i in z.infolist() if i.filename.endswith("/data.pkl"))
        assert p.value is not None and p.work * 2 <= limits.file_limit(nbytes), p.path
    assert sum(p.work for p in ins.pickles) * 4 <= limits.intake_limit(total)


def test_pickle_limits_bound_the_depth() -> None:
    data = b"\x80\x02" + b"]" * 20 + b"a" * 19 + b"."
    assert _codes(read_pickle(data, path="p", limits=PickleLimits(max_depth=10))) == ["pickle.too_deep"]


def test_dcp_items_that_name_one_byte_range_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A .metadata listing the same storage range a thousand times: refused as overlapping, and
    the range is read once, not a thousand times."""
    import dataclasses

    from ckptgate.inspect.formats import dcp as fdcp

    real_extract, real_read = fdcp.extract_dcp_metadata, fdcp.inspect_torch_zip
    distinct: list[int] = []

    def repeated(rep):  # type: ignore[no-untyped-def]
        md, fs = real_extract(rep)
        distinct.append(len(md.storage))
        return dataclasses.replace(md, storage=(md.storage[0],) * 1000 + md.storage[1:]), fs

    reads: list[int] = []

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        reads.append(k["base"])
        return real_read(*a, **k)

    monkeypatch.setattr(fdcp, "extract_dcp_metadata", repeated)
    monkeypatch.setattr(fdcp, "inspect_torch_zip", counted)
    ins = inspect_tree(FIXTURES / "dcp_torch_save" / "checkpoint")
    assert any(f.code == "dcp.items_overlap" for f in ins.findings) and not ins.clean
    assert len(reads) == distinct[0]


def test_no_file_is_opened_once_the_intake_budget_is_spent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptgate.inspect import inspection

    opened: list[str] = []
    real = inspection.analyse_file
    monkeypatch.setattr(inspection, "analyse_file", lambda tree, path, **k: opened.append(path) or real(tree, path, **k))
    zipped = torch_zip(laughs())
    with pytest.raises(InputRejected):
        inspect_tree(_tree(tmp_path, 200, zipped))
    limits = WorkLimits()
    per_file = limits.file_limit(len(laughs())) + 1  # each refused file is charged its whole budget
    assert len(opened) <= limits.intake_limit(200 * len(zipped)) // per_file + 1 < 200
