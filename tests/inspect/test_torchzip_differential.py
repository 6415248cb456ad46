"""ckptgate's torch zip reader against torch's own archive reader, on seeded mutations of every
torch zip the real fixtures hold (``tests/mutations.py``) and on deliberate name mutations:
duplicates, and names that collide under case folding, NFC/NFKC or path normalisation.

Whenever the static reader resolves a zip's records without a structural error (no ``zip.*`` or
``torch.*`` error finding: a superset of what it calls clean), torch's reader
(``torch._C.PyTorchFileReader``, the C++ ``PyTorchStreamReader`` over miniz that ``torch.load``
uses) must read exactly the same thing: the same record listing, the same answer to
``has_record`` for every record ``torch.load`` reads, and for each of them and each storage the
pickle names the same bytes at the same offset.  Torch runs in a subprocess and is asked for
record listings, record bytes and offsets only: nothing is ever unpickled.  The static reader may
refuse more than torch (it is stricter by design), never resolve differently.  Issue #16: a zip
with ``archive/data.pkl`` then ``archive/DATA.PKL`` was read as one pickle here and the other by
torch."""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mutations import build_zip, mutate_file, zip_members, zip_name_mutations

from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.torchzip import TORCH_READS, inspect_torch_zip
from ckptgate.inspect.zipcheck import ZipEntry, check_zip

pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
SEEDS = 8
#: the deliberate name mutations run on one torch zip of each fixture (they are alike within one)
TORCH_ZIPS = sorted(p for p in FIXTURES.rglob("*.pt") if p.read_bytes()[:4] == b"PK\x03\x04")

#: Torch's side, one process for the module: for each request (a JSON line: file -> records), for
#: each file ``get_all_records`` and, per record, ``has_record`` and, when present, the sha256 of
#: ``get_record`` and ``get_record_offset``; one JSON line back.  Never unpickles.
_TORCH_SIDE = r"""
import hashlib, json, sys
import torch
print(json.dumps({"ready": torch.__version__}), flush=True)
for line in sys.stdin:
    out = {}
    for path, records in json.loads(line).items():
        try:
            r = torch._C.PyTorchFileReader(path)
            got = {"all": sorted(r.get_all_records()), "records": {}}
            for name in records:
                if r.has_record(name):
                    data = r.get_record(name)
                    got["records"][name] = [hashlib.sha256(data).hexdigest(), len(data), r.get_record_offset(name)]
                else:
                    got["records"][name] = None
        except Exception as e:  # torch refuses the archive: it reads nothing from it
            got = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        out[path] = got
    print(json.dumps(out), flush=True)
"""


class _TorchReader:
    """The torch side in a subprocess, started once (importing torch is most of this test's time)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _TORCH_SIDE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert "ready" in self._answer(timeout=300)

    def _answer(self, timeout: float) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"torch's side did not answer (exit {self.proc.poll()})"
        return json.loads(line)

    def reads(self, files: dict[str, list[str]]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(files) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout=25)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def torch_side() -> Iterator[_TorchReader]:
    reader = _TorchReader()
    try:
        yield reader
    finally:
        reader.close()


def _static(path: Path) -> tuple[Any, list[str]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        layout, findings = inspect_torch_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=path.name)
    finally:
        os.close(fd)
    structural = [f.code for f in findings if f.severity == "error" and f.code.split(".")[0] in ("zip", "torch")]
    return layout, structural


def _entries(path: Path) -> tuple[ZipEntry, ...]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return check_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=path.name, verify_crc=False).entries
    finally:
        os.close(fd)


def _seeded_cases(tmp: Path) -> list[tuple[Path, str, bool]]:
    """``(file, how it was made, must the static reader refuse it)``: each fixture unchanged, and
    rebuilt around a changed member (mostly its pickle) or changed byte by byte."""
    cases = []
    for src in TORCH_ZIPS:
        rel = src.relative_to(FIXTURES)
        for seed in range(SEEDS):
            rng = random.Random(f"{rel}:{seed}")
            data, how = (src.read_bytes(), "unchanged") if seed == 0 else mutate_file(src, rng)
            p = tmp / f"s{len(cases)}.pt"
            p.write_bytes(data)
            cases.append((p, f"{rel} seed {seed}: {how}", False))
    return cases


def _name_cases(tmp: Path) -> list[tuple[Path, str, bool]]:
    """The deliberate name mutations, on one torch zip of each fixture (alike within one)."""
    firsts: dict[str, Path] = {}
    for src in TORCH_ZIPS:
        firsts.setdefault(src.relative_to(FIXTURES).parts[0], src)
    cases = []
    for src in firsts.values():
        rel = src.relative_to(FIXTURES)
        for data, how, refuse in zip_name_mutations(src.read_bytes(), random.Random(str(rel))):
            p = tmp / f"n{len(cases)}.pt"
            p.write_bytes(data)
            cases.append((p, f"{rel}: {how}", refuse))
    return cases


def _compare(cases: list[tuple[Path, str, bool]], torch_side: _TorchReader) -> int:
    """Assert that torch reads what the static reader resolved, for every case it resolved without
    a structural error; return how many were compared."""
    ours: dict[str, tuple[dict[str, tuple[int, int]], list[str], str]] = {}
    for p, how, refuse in cases:
        layout, structural = _static(p)
        if refuse:
            assert structural, f"{how}: the static reader accepted names torch may resolve another way"
            continue
        if structural or layout is None:
            continue
        rel_names = sorted(e.name[len(layout.prefix) + 1:] for e in _entries(p))
        ours[str(p)] = (layout.records, rel_names, how)
    asked = {p: sorted(set(TORCH_READS) | set(records)) for p, (records, _, _) in ours.items()}
    theirs = torch_side.reads(asked)
    compared = 0
    for p, (records, rel_names, how) in ours.items():
        got = theirs[p]
        if "error" in got:  # torch refuses what the static reader accepted: nothing is read, allowed
            assert "unchanged" not in how, f"{how}: torch cannot open the producer's own zip: {got['error']}"
            continue
        compared += 1
        assert got["all"] == rel_names, f"{how}: the record listings differ"
        raw = Path(p).read_bytes()
        for name in asked[p]:
            mine = records.get(name)
            if got["records"][name] is None:
                assert mine is None, f"{how}: the static reader read {name!r}, which torch does not have"
                continue
            assert mine is not None, f"{how}: torch reads {name!r}, which the static reader did not resolve"
            start, end = mine
            assert got["records"][name] == [hashlib.sha256(raw[start:end]).hexdigest(), end - start, start], \
                f"{how}: torch reads other bytes for {name!r}"
    return compared


def test_the_fixtures_hold_torch_zips_of_every_producer() -> None:
    producers = {p.relative_to(FIXTURES).parts[0] for p in TORCH_ZIPS}
    assert len(TORCH_ZIPS) >= 20 and {"deepspeed_zero2", "deepspeed_zero3", "fsdp_full"} <= producers


def test_torch_reads_another_pickle_in_the_recipe(tmp_path: Path, torch_side: _TorchReader) -> None:
    """The differential is real: with ``data.pkl`` then ``DATA.PKL``, torch reads ``DATA.PKL``."""
    src = FIXTURES / "deepspeed_zero2" / "checkpoint" / "global_step2" / "mp_rank_00_model_states.pt"
    members = zip_members(src.read_bytes())
    i = next(k for k, (n, _) in enumerate(members) if n.endswith("/data.pkl"))
    name, original = members[i]
    members[i] = (name, b"\x80\x02N.")
    members.insert(i + 1, (name[:-len("data.pkl")] + "DATA.PKL", original))
    p = tmp_path / "recipe.pt"
    p.write_bytes(build_zip(members))
    got = torch_side.reads({str(p): ["data.pkl"]})[str(p)]
    assert got["records"]["data.pkl"][0] == hashlib.sha256(original).hexdigest()
    layout, structural = _static(p)
    assert layout is None and "zip.name_collision" in structural


def test_torch_reads_no_stored_bytes_of_an_entry_marked_as_a_directory(tmp_path: Path,
                                                                        torch_side: _TorchReader) -> None:
    """The differential behind ``zip.directory_entry`` is real: with the DOS directory bit in a
    storage's external attributes, torch finds the record at the same offset and length but reads
    none of its stored bytes (seeded mutation ``trainer_peft_lora/.../optimizer.pt`` seed 7)."""
    src = FIXTURES / "deepspeed_zero2" / "checkpoint" / "global_step2" / "mp_rank_00_model_states.pt"
    raw = bytearray(src.read_bytes())
    entry = next(e for e in _entries(src) if e.name.endswith("/data/0"))
    c = raw.index(b"PK\x01\x02")
    while raw[c + 46:c + 46 + len(entry.name)] != entry.name.encode():
        c = raw.index(b"PK\x01\x02", c + 46)
    raw[c + 38] |= 0x10
    # bytes no reader has seen, so that torch's uninitialised buffer cannot hold them by chance
    # (miniz does not check the CRC of an entry it does not extract)
    raw[entry.data_offset:entry.data_offset + entry.size] = (b"ckptgate" * entry.size)[:entry.size]
    p = tmp_path / "directory.pt"
    p.write_bytes(bytes(raw))
    stored = raw[entry.data_offset:entry.data_offset + entry.size]
    got = torch_side.reads({str(p): ["data/0"]})[str(p)]["records"]["data/0"]
    assert got[1:] == [entry.size, entry.data_offset] and got[0] != hashlib.sha256(stored).hexdigest()
    layout, structural = _static(p)
    assert layout is None and structural == ["zip.directory_entry"]


def test_on_seeded_mutations_torch_reads_what_the_static_reader_resolved(tmp_path: Path,
                                                                          torch_side: _TorchReader) -> None:
    cases = _seeded_cases(tmp_path)
    # every unchanged fixture at least, and more, so the comparison ran
    assert _compare(cases, torch_side) > len(TORCH_ZIPS)


def test_on_name_mutations_torch_reads_what_the_static_reader_resolved(tmp_path: Path,
                                                                        torch_side: _TorchReader) -> None:
    cases = _name_cases(tmp_path)
    assert sum(refuse for _, _, refuse in cases) > 500
    assert _compare(cases, torch_side) >= 2 * len({c[1].split(":")[0] for c in cases})  # shuffled, new prefix
