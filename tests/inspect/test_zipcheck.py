"""Torch zip structure and tensor layout: local/central agreement, flags, CRC, bombs, storages."""

from __future__ import annotations

import gzip
import io
import os
import struct
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest

from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect import inspect_tree
from ckptgate.inspect.torchzip import inspect_torch_zip
from ckptgate.inspect.zipcheck import check_zip

from ckpt_inspect_helpers import p_state_dict, p_str, p_tensor, torch_zip, write

torch = pytest.importorskip("torch")


def _zip_codes(p: Path, **kw: object) -> list[str]:
    fd = os.open(p, os.O_RDONLY)
    try:
        return [f.code for f in check_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=p.name, **kw).findings]
    finally:
        os.close(fd)


def _tz(p: Path) -> tuple[object, list[str]]:
    fd = os.open(p, os.O_RDONLY)
    try:
        lay, f = inspect_torch_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=p.name)
        return lay, [x.code for x in f]
    finally:
        os.close(fd)


@pytest.fixture
def real_pt(tmp_path: Path) -> Path:
    p = tmp_path / "model.pt"
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)[1:],
                "t": torch.arange(4, dtype=torch.int64).reshape(2, 2).t()}, p)
    return p


def _patch_flags(p: Path, local: int | None, central: int | None) -> None:
    b = bytearray(p.read_bytes())
    if local is not None:
        struct.pack_into("<H", b, 6, local)
    if central is not None:
        c = b.index(b"PK\x01\x02")
        struct.pack_into("<H", b, c + 8, central)
    p.write_bytes(bytes(b))


def test_real_torch_zip_layout_is_exact(real_pt: Path) -> None:
    lay, codes = _tz(real_pt)
    assert codes == []
    got = {t.name: t for t in lay.tensors}
    ref = torch.load(real_pt, weights_only=True)  # the reference reader, on our own trusted test file
    raw = real_pt.read_bytes()
    for name, t in ref.items():
        r = got[name]
        assert (r.dtype, r.shape, r.stride, r.storage_offset) == (str(t.dtype).split(".")[1], tuple(t.shape),
                                                                  t.stride(), t.storage_offset())
        storage = raw[r.storage_range[0]:r.storage_range[1]]
        assert storage == bytes(t.untyped_storage())
    assert not got["t"].contiguous and got["w"].contiguous
    assert lay.pickle.plain_tensors


def test_local_and_central_names_differ(real_pt: Path) -> None:
    b = bytearray(real_pt.read_bytes())
    i = b.index(b"data.pkl")  # first occurrence: the local header
    b[i:i + 8] = b"data.pkX"
    real_pt.write_bytes(bytes(b))
    assert _zip_codes(real_pt) == ["zip.name_mismatch"]


def test_encryption_flag(real_pt: Path) -> None:
    _patch_flags(real_pt, 0x0809, 0x0809)
    assert _zip_codes(real_pt) == ["zip.encrypted"]


def test_unknown_flag_bits(real_pt: Path) -> None:
    _patch_flags(real_pt, 0x2808, 0x2808)
    assert _zip_codes(real_pt) == ["zip.unknown_flags"]


def test_local_central_flag_mismatch(real_pt: Path) -> None:
    _patch_flags(real_pt, 0x0800, None)
    assert _zip_codes(real_pt) == ["zip.flag_mismatch"]


def test_bad_crc(real_pt: Path) -> None:
    b = bytearray(real_pt.read_bytes())
    fd = os.open(real_pt, os.O_RDONLY)
    try:
        e = next(x for x in check_zip(HashedFile.over(fd), len(b), path="m").entries if x.name.endswith("data/0"))
    finally:
        os.close(fd)
    b[e.data_offset] ^= 0xFF
    real_pt.write_bytes(bytes(b))
    assert _zip_codes(real_pt) == ["zip.bad_crc"]


def test_data_descriptor_disagrees_with_central_directory(real_pt: Path) -> None:
    b = bytearray(real_pt.read_bytes())
    i = b.index(b"PK\x07\x08")  # torch writes a signed data descriptor after each entry
    b[i + 4] ^= 0xFF  # its CRC
    real_pt.write_bytes(bytes(b))
    assert _zip_codes(real_pt) == ["zip.descriptor_mismatch"]


def _patch_external_attributes(p: Path, suffix: bytes, value: int) -> None:
    """Set the external attributes of the central entry whose name ends with ``suffix``."""
    b = bytearray(p.read_bytes())
    c = b.index(b"PK\x01\x02")
    while not bytes(b[c + 46:c + 46 + struct.unpack_from("<H", b, c + 28)[0]]).endswith(suffix):
        c = b.index(b"PK\x01\x02", c + 46)
    struct.pack_into("<I", b, c + 38, value)
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("value", [0x10, 0xFFFFFFFF, 0x41ED0010])
def test_an_entry_marked_as_a_directory_is_refused(real_pt: Path, value: int) -> None:
    """miniz treats an entry whose external attributes carry the DOS directory bit as a directory,
    whatever its name, and extracts none of its bytes: torch then reads an uninitialised buffer
    where the static reader resolved the stored storage (a seeded mutation found it)."""
    _patch_external_attributes(real_pt, b"data/0", value)
    assert _zip_codes(real_pt) == ["zip.directory_entry"]
    lay, codes = _tz(real_pt)
    assert lay is None and codes == ["zip.directory_entry"]


def test_external_attributes_miniz_ignores_are_accepted(real_pt: Path) -> None:
    _patch_external_attributes(real_pt, b"data/0", 0o100644 << 16)  # a Unix regular file's mode
    assert _zip_codes(real_pt) == []


def test_duplicate_entry_names(tmp_path: Path) -> None:
    p = tmp_path / "dup.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02N.")
            z.writestr("archive/data.pkl", b"\x80\x02N.")
    assert _zip_codes(p) == ["zip.duplicate_name"]
    # inspection says what is wrong with it, not only that it cannot be classified
    assert "zip.duplicate_name" in {f.code for f in inspect_tree(tmp_path).findings}


def test_bytes_before_first_header(real_pt: Path, tmp_path: Path) -> None:
    real_pt.write_bytes(b"JUNK" + real_pt.read_bytes())
    assert _zip_codes(real_pt) == ["zip.bad_zip64"]  # torch writes zip64 records; their offsets disagree
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr("a", b"x")
    plain.write_bytes(b"JUNK" + plain.read_bytes())
    assert _zip_codes(plain) == ["zip.bad_central_offset"]


def test_bytes_after_central_directory(real_pt: Path) -> None:
    real_pt.write_bytes(real_pt.read_bytes() + b"tail")
    assert _zip_codes(real_pt) == ["zip.trailing_bytes"]


def test_zip_bomb_ratio(tmp_path: Path) -> None:
    p = tmp_path / "bomb.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", b"\0" * (8 << 20))
    assert _zip_codes(p) == ["zip.compression_ratio"]


def test_compressed_torch_entry_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "c.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}.")
    _lay, codes = _tz(p)
    assert codes == ["zip.compressed"]


def test_unsafe_entry_name(tmp_path: Path) -> None:
    p = tmp_path / "u.zip"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("../evil", b"x")
    assert _zip_codes(p) == ["zip.unsafe_name"]


def test_storage_shorter_than_numel(tmp_path: Path) -> None:
    p = torch_zip(tmp_path / "s.pt", p_state_dict({"w": p_tensor("0", 10, (10,), (1,))}), {"0": b"\0" * 8})
    _lay, codes = _tz(p)
    assert codes == ["torch.storage_size_mismatch"]


def test_tensor_view_past_storage(tmp_path: Path) -> None:
    p = torch_zip(tmp_path / "s.pt", p_state_dict({"w": p_tensor("0", 4, (3, 3), (3, 1))}), {"0": b"\0" * 16})
    _lay, codes = _tz(p)
    assert codes == ["torch.tensor_out_of_bounds"]


def test_missing_storage(tmp_path: Path) -> None:
    p = torch_zip(tmp_path / "s.pt", p_state_dict({"w": p_tensor("7", 1, (1,), (1,))}), {})
    _lay, codes = _tz(p)
    assert codes == ["torch.storage_missing"]


def test_pickle_hidden_in_a_storage(tmp_path: Path) -> None:
    inner = b"\x80\x04\x95" + b"\0" * 13
    p = torch_zip(tmp_path / "s.pt", p_state_dict({"w": p_tensor("0", 4, (4,), (1,))}), {"0": inner})
    _lay, codes = _tz(p)
    assert codes == ["torch.storage_looks_like_pickle"]


def test_torchscript_archive_offered_as_weights(tmp_path: Path) -> None:
    torch_zip(tmp_path / "model.pt", b"\x80\x02}.", {}, extra={"constants.pkl": b"\x80\x02).",
                                                                  "code/__torch__.py": b"def f(): pass"})
    insp = inspect_tree(tmp_path)
    codes = {f.code for f in insp.findings}
    assert insp.files[0].kind == "torchscript"
    assert {"torch.torchscript_archive", "classify.extension_mismatch"} <= codes


def test_legacy_tar_offered_as_weights(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for n in ("sys_info", "pickle", "storages", "tensors"):
            data = b"\x80\x02N."
            info = tarfile.TarInfo(n)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    write(tmp_path, "old.pt", buf.getvalue())
    insp = inspect_tree(tmp_path)
    assert insp.files[0].kind == "legacy_torch"
    assert {"classify.legacy_torch", "classify.extension_mismatch"} <= {f.code for f in insp.findings}
    assert "torch_load" in insp.loaders


def test_legacy_raw_pickle_magic(tmp_path: Path) -> None:
    magic = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
    write(tmp_path, "old.bin", b"\x80\x02\x8a\x0a" + magic + b".")
    insp = inspect_tree(tmp_path)
    assert insp.files[0].kind == "legacy_torch"
    assert "classify.legacy_torch" in {f.code for f in insp.findings}


@pytest.mark.parametrize("wrapper", ["7z", "gzip", "tar"])
def test_archive_wrappers_around_torch_data(wrapper: str, tmp_path: Path, real_pt: Path) -> None:
    raw = real_pt.read_bytes()
    if wrapper == "7z":
        data = b"7z\xbc\xaf\x27\x1c\x00\x04" + raw
    elif wrapper == "gzip":
        data = gzip.compress(raw)
    else:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
            info = tarfile.TarInfo("model.pt")
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
        data = buf.getvalue()
    root = tmp_path / "ck"
    write(root, "pytorch_model.bin", data)
    insp = inspect_tree(root)
    assert insp.files[0].kind == "archive"
    assert {"classify.archive", "classify.extension_mismatch"} <= {f.code for f in insp.findings}


# --------------------------------------------------------------------------- names torch resolves
# miniz, under torch's reader, looks records up ignoring ASCII case; other readers fold Unicode case,
# normalise (NFC, NFKC) or normalise paths.  Two names one of them takes for the same file are refused.

def _members_zip(p: Path, members: list[tuple[str, bytes]]) -> Path:
    from mutations import build_zip

    p.write_bytes(build_zip(members))
    return p


def _torch_members(pkl: bytes = b"\x80\x02}.") -> list[tuple[str, bytes]]:
    return [("archive/data.pkl", pkl), ("archive/byteorder", b"little"), ("archive/version", b"3\n")]


@pytest.mark.parametrize(("fold", "first", "second"), [
    ("case", "archive/data.pkl", "archive/DATA.PKL"),  # the issue #16 recipe's pair
    ("case", "archive/data/0", "archive/Data/0"),
    ("case", "archive/strasse", "archive/STRAßE"),  # full Unicode case folding, beyond miniz's ASCII
    ("nfc", "archive/caf\u00e9", "archive/cafe\u0301"),
    ("nfkc", "archive/data.pkl", "archive/data.\uff50kl"),  # FULLWIDTH LATIN SMALL LETTER P
    ("nfkc", "archive/data/0", "archive/data\uff0f0"),  # FULLWIDTH SOLIDUS
    ("combined", "archive/data.pkl", "archive/DATA.\uff50kl"),  # only case and NFKC together
])
def test_names_that_collide_are_refused(tmp_path: Path, fold: str, first: str, second: str) -> None:
    for order in ((first, second), (second, first)):
        base = [m for m in _torch_members() if m[0] not in order]
        p = _members_zip(tmp_path / "c.pt", [*base, (order[0], b"a"), (order[1], b"b")])
        fd = os.open(p, os.O_RDONLY)
        try:
            rep = check_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=p.name)
        finally:
            os.close(fd)
        [f] = [f for f in rep.findings if f.code == "zip.name_collision"]
        assert f.severity == "error" and f.evidence["fold"] == fold
        assert set(f.evidence["names"]) == {first, second}
        lay, codes = _tz(p)
        assert lay is None and "zip.name_collision" in codes


def test_the_recipe_data_pkl_beside_DATA_PKL_is_refused_in_either_order(tmp_path: Path) -> None:
    payload = b"\x80\x02cbuiltins\nprint\nX\x02\x00\x00\x00hi\x85R."
    for before in (False, True):
        members = _torch_members(b"\x80\x02N.")
        members.insert(0 if before else 1, ("archive/DATA.PKL", payload))
        p = _members_zip(tmp_path / f"m{before}.pt", members)
        lay, codes = _tz(p)
        assert lay is None and "zip.name_collision" in codes


@pytest.mark.parametrize(("name", "code"), [
    ("archive/./data.pkl", "zip.noncanonical_name"),
    ("archive//data.pkl", "zip.noncanonical_name"),
    ("archive/data/", "zip.noncanonical_name"),  # a trailing slash: a directory entry
    ("archive/data.pkl/", "zip.noncanonical_name"),
    ("archive\\data.pkl", "zip.unsafe_name"),
    ("/archive/data.pkl", "zip.unsafe_name"),
    ("archive/x/../data.pkl", "zip.unsafe_name"),
])
def test_names_that_path_normalisation_changes_are_refused(tmp_path: Path, name: str, code: str) -> None:
    p = _members_zip(tmp_path / "n.pt", [*_torch_members(), (name, b"x")])
    assert _zip_codes(p) == [code]
    lay, codes = _tz(p)
    assert lay is None and codes == [code]


def test_path_normalisation_collisions_are_named() -> None:
    from ckptgate.inspect.zipcheck import name_collisions

    assert name_collisions(["a/b", "a/./b", "a//b", "a\\b", "/a/b", "a/x/../b", "a/b/"]) == [
        ("path", "a/b", n) for n in ("a/./b", "a//b", "a\\b", "/a/b", "a/x/../b", "a/b/")]
    assert name_collisions(["a/b", "a/c", "A/c\u0301"]) == []
    assert name_collisions(["a", "a"]) == []  # exact duplicates: zip.duplicate_name, not a fold


def test_a_name_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    p = _members_zip(tmp_path / "u.pt", [*_torch_members(), ("archive/Q.bin", b"x")])
    p.write_bytes(p.read_bytes().replace(b"archive/Q.bin", b"archive/\xff.bin"))  # local and central
    assert _zip_codes(p) == ["zip.bad_name"]
    assert _tz(p)[1] == ["zip.bad_name"]


@pytest.mark.parametrize("members", [
    [("archive/data.pkl", b"\x80\x02}."), ("other/version", b"3\n")],
    [("archive/data.pkl", b"\x80\x02}."), ("ARCHIVE/version", b"3\n")],  # torch's prefix check is exact
    [("version", b"3\n"), ("archive/data.pkl", b"\x80\x02}.")],  # torch: "not in a subdirectory"
    [("archive/version", b"3\n"), ("data.pkl", b"\x80\x02}.")],
])
def test_names_prefixed_inconsistently_are_refused(tmp_path: Path, members: list[tuple[str, bytes]]) -> None:
    lay, codes = _tz(_members_zip(tmp_path / "p.pt", members))
    assert lay is None and codes == ["torch.bad_archive"]


@pytest.mark.parametrize("rename", [("archive/data.pkl", "archive/DATA.PKL"), ("archive/version", "archive/Version"),
                                    ("archive/byteorder", "archive/BYTEORDER"), ("archive/data/0", "archive/DATA/0")])
def test_a_record_torch_finds_only_by_ignoring_case_is_refused(tmp_path: Path, rename: tuple[str, str]) -> None:
    members = [("archive/data.pkl", p_state_dict({"w": p_tensor("0", 1, (1,), (1,))})),
               ("archive/byteorder", b"little"), ("archive/data/0", b"\0" * 4), ("archive/version", b"3\n")]
    members = [(rename[1] if n == rename[0] else n, d) for n, d in members]
    p = _members_zip(tmp_path / "r.pt", members)
    fd = os.open(p, os.O_RDONLY)
    try:
        lay, findings = inspect_torch_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=p.name)
    finally:
        os.close(fd)
    record = rename[0].split("/", 1)[1]
    [f] = [f for f in findings if f.code == "torch.record_name_mismatch"]
    assert f.severity == "error" and f.evidence == {"record": record, "entry": rename[1]}
    assert lay is None or record not in lay.records


def test_the_resolver_refuses_a_record_two_entries_answer() -> None:
    """Unreachable through ``inspect_torch_zip`` (the zip check refuses the pair first as a name
    collision); the resolver refuses it on its own too."""
    from ckptgate.inspect.torchzip import _Records
    from ckptgate.inspect.zipcheck import ZipEntry

    def entry(name: str, i: int) -> ZipEntry:
        return ZipEntry(name=name, flags=0, method=0, crc=0, compressed_size=1, size=1, header_offset=i * 64,
                        data_offset=i * 64 + 40, index=i)

    findings: list = []
    rec = _Records("archive", (entry("archive/data.pkl", 0), entry("archive/DATA.PKL", 1),
                               entry("archive/version", 2)), 100, "m.pt", findings)
    assert rec.get("data.pkl") is None and [f.code for f in findings] == ["torch.ambiguous_record"]
    assert rec.get("version").index == 2
    assert rec.get("version\0junk") is None  # torch reads archive/version (a C string ends at NUL): refused
    assert [f.code for f in findings][1:] == ["torch.record_name_mismatch"]
    assert findings[1].evidence == {"record": "version\0junk", "entry": "archive/version"}
    assert rec.ranges() == {"version": (100 + 168, 100 + 169)}


def test_records_resolve_to_what_torch_reads_in_a_real_zip(real_pt: Path) -> None:
    lay, codes = _tz(real_pt)
    assert codes == []
    raw = real_pt.read_bytes()
    assert {"data.pkl", "byteorder", "version", ".data/serialization_id"} <= set(lay.records)
    assert {f"data/{t.storage_key}" for t in lay.tensors} <= set(lay.records)
    assert raw[slice(*lay.records["byteorder"])] == b"little"
    reader = torch._C.PyTorchFileReader(str(real_pt))  # records only: nothing is unpickled
    for record, (start, end) in lay.records.items():
        assert reader.get_record(record) == raw[start:end], record
        assert reader.get_record_offset(record) == start, record


def _bare_persid(key: bytes) -> bytes:
    """A pickle whose root is a storage persistent id outside any tensor-rebuilding call."""
    return b"\x80\x02(" + p_str("storage") + b"ctorch\nFloatStorage\n" + key + p_str("cpu") + b"J\x01\x00\x00\x00tQ."


@pytest.mark.parametrize(("entry", "codes"), [
    ("archive/data/0", []),
    ("archive/DATA/0", ["torch.record_name_mismatch", "torch.storage_missing"]),
    ("archive/data/1", ["torch.storage_missing"]),
])
def test_a_storage_named_outside_any_tensor_is_resolved_as_torch_would(tmp_path: Path, entry: str,
                                                                      codes: list[str]) -> None:
    """torch.load's persistent_load reads ``data/<key>`` for every persistent id it meets, in a
    recognised tensor or not."""
    p = _members_zip(tmp_path / "k.pt", [*_torch_members(_bare_persid(p_str("0"))), (entry, b"\0" * 4)])
    lay, found = _tz(p)
    assert [c for c in found if c.startswith("torch.") and c != "torch.unknown_record"
            and c != "torch.storage_unreferenced"] == codes
    assert ("data/0" in lay.records) == (not codes)


def test_a_persistent_id_torch_would_not_resolve_as_a_storage_is_refused(tmp_path: Path) -> None:
    p = _members_zip(tmp_path / "k.pt", [*_torch_members(_bare_persid(b"\x88")), ("archive/data/0", b"\0" * 4)])
    assert "torch.unrecognised_persistent_id" in _tz(p)[1]
    p = _members_zip(tmp_path / "i.pt", [*_torch_members(_bare_persid(b"K\x00")), ("archive/data/0", b"\0" * 4)])
    lay, found = _tz(p)  # an int key: torch reads f"data/{0}"
    assert "torch.unrecognised_persistent_id" not in found and "data/0" in lay.records
