"""Classification by content; the extension can only add a finding."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect import inspect_tree
from ckptgate.inspect.classify import FileKind, classify_file

from ckpt_inspect_helpers import st_bytes, write


def _classify(p: Path):  # noqa: ANN202
    fd = os.open(p, os.O_RDONLY)
    try:
        return classify_file(HashedFile.over(fd), os.fstat(fd).st_size, p.name)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("name", "data", "kind"), [
    ("a.json", b'  {"a": 1}', FileKind.JSON),
    ("latest", b"global_step2\n", FileKind.TEXT),
    ("empty.txt", b"", FileKind.EMPTY),
    ("zero_to_fp32.py", b"#!/usr/bin/env python\nimport torch\n", FileKind.CODE),
    ("helper", b"import os\nos.system('id')\n", FileKind.CODE),
    ("kernel.so", b"\x7fELF\x02\x01\x01\x00" + b"\0" * 56, FileKind.CODE),
    ("blob.bin", b"\x00\x01\x02\xff" * 10, FileKind.UNKNOWN),
    # protocol 0 is text: pickle.load acts on each opcode as it reads it, so a stream that imports
    # and calls is a pickle even when it never reaches STOP, and even past the probe's 1 MiB
    ("latest_notes", b"cos\nsystem\n(S'touch /tmp/x'\ntR\n# run notes\n", FileKind.PICKLE),
    ("notes.txt", b"cos\nsystem\n(S'touch /tmp/x'\ntR" + b"x" * (2 << 20), FileKind.PICKLE),
    ("README.md", b"(S'id'\nios\nsystem\n", FileKind.PICKLE),  # INST imports and calls at once
    ("README.md", b"cosmic\nnotes about this model\n", FileKind.TEXT),  # a GLOBAL-shaped start, no call
    ("README.md", b"credits\nauthors\nThis model was trained\n", FileKind.TEXT),
    # what pickletools refuses but the interpreter's unpickler accepts: it is the oracle
    ("notes.txt", b"I0x1\n0cbuiltins\nprint\n(S'x'\ntR.", FileKind.PICKLE),  # a base-16 INT
    ("notes.txt", b"S'\xc3\xa9'\n0cbuiltins\nprint\n(S'x'\ntR.", FileKind.PICKLE),  # a non-ASCII STRING
    ("notes.txt", b"S'" + b"a" * 5000 + b"'\n0\x8c\x08builtins\x8c\x05print\x93\x8c\x01x\x85R\xffjunk",
     FileKind.PICKLE),  # STACK_GLOBAL after a text head, then garbage
    ("extra_state.dat", b"\x8c\x08builtins\x8c\x05print\x93\x8c\x01x\x85R\xff", FileKind.PICKLE),  # no PROTO
    ("notes.txt", b"S'" + b"a" * (5 << 20) + b"'\n0cbuiltins\nprint\n(S'x'\ntR.", FileKind.PICKLE),  # padded
])
def test_kinds(name: str, data: bytes, kind: FileKind, tmp_path: Path) -> None:
    assert _classify(write(tmp_path, name, data)).kind == kind


def test_safetensors_whose_length_prefix_starts_0x80_is_not_a_pickle(tmp_path: Path) -> None:
    hdr = ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}').ljust(128)
    p = write(tmp_path, "x.safetensors", st_bytes(hdr, b"\x01"))
    assert p.read_bytes()[0] == 0x80
    assert _classify(p).kind == FileKind.SAFETENSORS


def test_text_named_json_and_json_named_safetensors(tmp_path: Path) -> None:
    write(tmp_path, "config.json", "not json at all")
    write(tmp_path, "model.safetensors", '{"a": 1}')
    insp = inspect_tree(tmp_path)
    by: dict[str, set[str]] = {}
    for f in insp.findings:
        by.setdefault(f.path, set()).add(f.code)
    assert by["config.json"] == {"classify.extension_mismatch"}
    # the 8 bytes '{"a": 1}' read as a little-endian length are far over the cap
    assert by["model.safetensors"] == {"classify.extension_mismatch", "input.safetensors.header_too_large"}


def test_numpy_object_dtype_is_a_pickle_in_disguise(tmp_path: Path) -> None:
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ok.npy", np.zeros(3, np.float32))
    insp = inspect_tree(tmp_path)
    assert [(f.path, f.code) for f in insp.findings if f.severity == "error"] == [("obj.npy", "numpy.object_dtype")]
