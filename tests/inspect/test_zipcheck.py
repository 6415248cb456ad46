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

from ckpt_inspect_helpers import p_state_dict, p_tensor, torch_zip, write

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
