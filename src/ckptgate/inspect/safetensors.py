"""Our own strict safetensors header validator: one ordered pass, one error code per check.

Reads only the 8-byte prefix and the JSON header from a descriptor (``pread``) [R11].  In order:
``too_small``, ``header_too_large``, ``header_beyond_file``, ``header_nul``, ``bom``,
``not_utf8``, ``not_object_start``, ``json_too_deep``, ``duplicate_key``, ``invalid_json``,
``header_not_object``, ``metadata_not_str_map``, ``tensor_fields``, ``unknown_dtype``,
``bad_shape``, ``bad_offsets``, ``offsets_reversed``, ``offsets_gap``/``offsets_overlap``,
``shape_overflow``, ``size_mismatch``, ``trailing_bytes``/``offsets_beyond_file``.  Every code is
prefixed ``input.safetensors.``.  A header that validates is well-formed, nothing more: it says
nothing about where the file came from [R11].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptgate._json import MAX_DEPTH, JSONRejected, depth, loads_strict
from ckptgate.dtypes import SAFETENSORS_BITS, TORCH_TO_SAFETENSORS
from ckptgate.errors import InputRejected
from ckptgate.inspect.hashed import HashedFile

__all__ = ["DTYPE_BITS", "TORCH_DTYPES", "SafetensorsHeader", "TensorInfo", "parse_header_bytes", "read_header"]

MAX_HEADER = 100_000_000
MAX_JSON_DEPTH = MAX_DEPTH
MAX_TENSORS = 1 << 17
"""Tensors in one file: ten times the most a released model puts in a shard (DeepSeek-V3 holds
about 91,000 in all).  More would make inspection and the policy input large for no model."""
_MAX_SAFE_INT = 1 << 53

#: safetensors dtype codes, in bits (from :data:`ckptgate.dtypes.DTYPES`).
DTYPE_BITS: Mapping[str, int] = SAFETENSORS_BITS

#: torch dtype names (as inspection reports them) -> the safetensors dtype codes they map to.
TORCH_DTYPES: Mapping[str, str] = TORCH_TO_SAFETENSORS


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]  # relative to data_start, half-open

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BITS:
            raise ValueError(f"unknown dtype {self.dtype}")
        if self.data_offsets[0] > self.data_offsets[1]:
            raise ValueError("reversed offsets")

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "data_offsets": list(self.data_offsets),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SafetensorsHeader:
    header_len: int
    data_start: int  # absolute file offset of the data buffer (8 + header_len)
    file_size: int
    tensors: tuple[TensorInfo, ...]  # in header order
    metadata: dict[str, str] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.data_start != 8 + self.header_len:
            raise ValueError("data_start must be 8 + header_len")

    def to_json(self) -> dict[str, Any]:
        return {
            "header_len": self.header_len,
            "data_start": self.data_start,
            "file_size": self.file_size,
            "metadata": self.metadata,
            "tensors": [t.to_json() for t in self.tensors],
        }


def _rej(check: str, msg: str, path: str, **ev: Any) -> InputRejected:
    return InputRejected(f"input.safetensors.{check}", f"{path}: {msg}", evidence={"path": path, **ev})


def _too_deep(v: Any, path: str) -> None:
    """Called on a failing entry only: a nesting bomb gets its own code."""
    if depth(v, MAX_JSON_DEPTH) > MAX_JSON_DEPTH - 1:
        raise _rej("json_too_deep", f"header JSON nests deeper than {MAX_JSON_DEPTH}", path)


def _json_rej(r: JSONRejected, path: str) -> InputRejected:
    if r.kind == "too_deep":
        return _rej("json_too_deep", f"header JSON nests deeper than {MAX_JSON_DEPTH}", path)
    if r.kind == "duplicate_key":
        key = r.detail["key"]
        return _rej("duplicate_key", f"duplicate JSON key {key!r}", path, key=key[:200])
    return _rej("invalid_json", r.message, path)  # "header is not valid JSON: ..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header_bytes(prefix_and_header: bytes, file_size: int, *, path: str = "<bytes>") -> SafetensorsHeader:
    """Validate a header given the first ``8 + n`` bytes of a file of ``file_size`` bytes."""
    return _validate(lambda off, n: prefix_and_header[off : off + n], file_size, path, MAX_HEADER)


def read_header(src: HashedFile, file_size: int, *, path: str, max_header: int = MAX_HEADER) -> SafetensorsHeader:
    """Validate the header of the safetensors file ``src`` (its bytes are the hashed bytes)."""
    return _validate(lambda off, n: src.pread(n, off), file_size, path, max_header)


def _validate(read: Any, file_size: int, path: str, max_header: int) -> SafetensorsHeader:
    # 1. prefix
    if file_size < 8:
        raise _rej("too_small", "fewer than 8 bytes; no length prefix", path, size=file_size)
    n = int.from_bytes(read(0, 8), "little")
    # 2. header cap
    if n > max_header:
        raise _rej(
            "header_too_large",
            f"header length {n} exceeds the {max_header}-byte cap",
            path,
            header_len=n,
            limit=max_header,
        )
    # 3. length vs file
    if 8 + n > file_size:
        raise _rej(
            "header_beyond_file", "header length runs past the end of the file", path, header_len=n, size=file_size
        )
    raw = read(8, n)
    if len(raw) != n:
        raise _rej("header_beyond_file", "short read of the header", path)
    # 4. bytes and UTF-8
    if b"\x00" in raw:
        raise _rej("header_nul", "header contains NUL bytes (padding must be spaces)", path, at=raw.index(b"\x00"))
    if raw.startswith(b"\xef\xbb\xbf"):
        raise _rej("bom", "header starts with a UTF-8 byte-order mark", path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _rej("not_utf8", "header is not valid UTF-8", path, at=e.start) from None
    if not text.startswith("{"):
        raise _rej("not_object_start", "header does not start with '{'", path)
    # 5. JSON, after a count of the tensors it would declare (each has one "data_offsets" key)
    if text.count('"data_offsets"') > MAX_TENSORS:
        raise _rej("too_many_tensors", f"header declares more than {MAX_TENSORS} tensors", path, limit=MAX_TENSORS)
    # the field checks below bound the depth to 3; a nesting bomb the scanner stops is ``json_too_deep``
    doc = loads_strict(text, what="header", max_depth=None, error=lambda r: _json_rej(r, path))
    if not isinstance(doc, dict):
        raise _rej("header_not_object", "header JSON is not an object", path)
    if len(doc) - ("__metadata__" in doc) > MAX_TENSORS:  # a key escaped in JSON hides from the count above
        raise _rej("too_many_tensors", f"header declares more than {MAX_TENSORS} tensors", path, limit=MAX_TENSORS)
    meta: dict[str, str] | None = None
    tensors: list[TensorInfo] = []
    for name, v in doc.items():
        if name == "__metadata__":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                _too_deep(v, path)
                raise _rej("metadata_not_str_map", "__metadata__ is not a string-to-string map", path)
            meta = dict(v)
            continue
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            _too_deep(v, path)
            raise _rej(
                "tensor_fields",
                f"tensor {name!r} must have exactly dtype, shape, data_offsets",
                path,
                tensor=name[:200],
            )
        dtype, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise _rej(
                "unknown_dtype",
                f"tensor {name!r} has unknown dtype {dtype!r}",
                path,
                tensor=name[:200],
                dtype=str(dtype)[:40],
            )
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            _too_deep(shape, path)
            raise _rej(
                "bad_shape", f"tensor {name!r} shape is not a list of non-negative integers", path, tensor=name[:200]
            )
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(_is_int(o) and 0 <= o <= _MAX_SAFE_INT for o in offs)
        ):
            raise _rej(
                "bad_offsets", f"tensor {name!r} data_offsets is not two integers in [0, 2^53]", path, tensor=name[:200]
            )
        if offs[0] > offs[1]:
            raise _rej(
                "offsets_reversed",
                f"tensor {name!r} begin offset is after its end",
                path,
                tensor=name[:200],
                data_offsets=offs,
            )
        tensors.append(TensorInfo(name=name, dtype=dtype, shape=tuple(shape), data_offsets=(offs[0], offs[1])))
    # 6. offsets contiguous from 0
    expected = 0
    for t in sorted(tensors, key=lambda t: (t.data_offsets[0], t.data_offsets[1])):
        b, end = t.data_offsets
        if b > expected:
            raise _rej(
                "offsets_gap", f"gap before tensor {t.name!r}", path, tensor=t.name[:200], begin=b, expected=expected
            )
        if b < expected:
            raise _rej(
                "offsets_overlap",
                f"tensor {t.name!r} overlaps the previous tensor",
                path,
                tensor=t.name[:200],
                begin=b,
                expected=expected,
            )
        expected = end
    for t in tensors:
        # 7. checked multiplication, over the non-zero dims: a zero first hid [0, 2**64] and
        # [0] + [2**62] * 100_000 (whose strides the library refuses to compute, and whose
        # products grow quadratically in any later walk) behind a numel of 0
        wide = 1
        for d in t.shape:
            wide *= d or 1
            if wide >= 1 << 64:
                raise _rej(
                    "shape_overflow",
                    f"tensor {t.name!r} shape product (of its non-zero dims) overflows 64 bits",
                    path,
                    tensor=t.name[:200],
                )
        numel = wide if all(t.shape) else 0
        bits = numel * DTYPE_BITS[t.dtype]
        if bits >= 1 << 67:
            raise _rej("shape_overflow", f"tensor {t.name!r} byte size overflows 64 bits", path, tensor=t.name[:200])
        # 8. byte size vs shape
        if bits % 8 or bits // 8 != t.nbytes:
            raise _rej(
                "size_mismatch",
                f"tensor {t.name!r} spans {t.nbytes} bytes but its shape and dtype need {bits / 8:g}",
                path,
                tensor=t.name[:200],
                nbytes=t.nbytes,
                expected_bits=bits,
            )
    # 9. buffer covered exactly
    buf = file_size - 8 - n
    if expected < buf:
        raise _rej("trailing_bytes", f"{buf - expected} bytes follow the last tensor", path, trailing=buf - expected)
    if expected > buf:
        raise _rej("offsets_beyond_file", "tensor data runs past the end of the file", path, end=expected, buffer=buf)
    return SafetensorsHeader(header_len=n, data_start=8 + n, file_size=file_size, tensors=tuple(tensors), metadata=meta)
