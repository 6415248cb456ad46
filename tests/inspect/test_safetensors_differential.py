"""ckptgate's safetensors header parser against the ``safetensors`` library, on seeded mutations
of every safetensors file the real fixtures hold (``tests/mutations.py``): whatever the parser
accepts, the library reads as the same tensors (names, dtypes, shapes and bytes). The parser may
refuse more than the library (it is stricter by design), never less, and never disagree."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from mutations import mutate_file

from ckptgate.errors import Error
from ckptgate.inspect.safetensors import parse_header_bytes

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
FILES = sorted(FIXTURES.rglob("*.safetensors"))
SEEDS = 24


def _library(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]] | None:
    try:
        with safe_open(str(path), "pt") as f:
            out = {}
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                t = f.get_tensor(name)
                out[name] = (f.get_slice(name).get_dtype(), tuple(t.shape),
                             t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            return out
    except Exception:  # noqa: BLE001 - any refusal by the library
        return None


def test_the_fixtures_hold_safetensors_files() -> None:
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_what_the_parser_accepts_the_library_reads_the_same(path: Path, tmp_path: Path) -> None:
    for seed in range(SEEDS):
        rng = random.Random(f"{path.relative_to(FIXTURES)}:{seed}")
        data, how = (path.read_bytes(), "unchanged") if seed == 0 else mutate_file(path, rng)
        copy = tmp_path / f"{seed}.safetensors"
        copy.write_bytes(data)
        try:
            header = parse_header_bytes(data, len(data), path=path.name)
        except Error:
            # Stricter than the library is allowed, except on what a producer wrote unchanged
            # (one fixture is a torch stream named .safetensors: both refuse it).
            assert seed > 0 or _library(copy) is None, "the parser refuses a file the library reads"
            continue
        ours = {t.name: (t.dtype, tuple(t.shape),
                         data[header.data_start + t.data_offsets[0]:header.data_start + t.data_offsets[1]])
                for t in header.tensors}
        assert _library(copy) == ours, f"seed {seed} ({how})"
