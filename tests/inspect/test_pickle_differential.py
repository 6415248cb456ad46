"""The static reader against CPython's own unpickler, on seeded mutations of every pickle the
real fixtures hold (``tests/mutations.py``): whenever the reader calls a stream complete and
inside an allowlist, unpickling it names no global that the reader did not report.

The scanners' record is parser differentials: a stream one reader sees as harmless and the
loader resolves differently (attack catalogue: STACK_GLOBAL operands from memo, EXT opcodes,
trampolines). CPython's pure-Python ``pickle._Unpickler`` is the loader here, with
``find_class`` recording each name and returning an inert stub, so nothing is imported or
called; its memo is a dict, so a mutated memo index cannot allocate a huge table."""

from __future__ import annotations

import hashlib
import io
import pickle
import random
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from mutations import mutate_bytes, mutate_pickle_values

from ckptgate.inspect.allowlist import ALLOWLISTS
from ckptgate.inspect.pickle import read_pickle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
SEEDS = 24


class _Inert:
    """What every global resolves to: accepts any construction, call, state or item."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def add(self, item: Any) -> None:
        pass


class _Recorder(pickle._Unpickler):  # type: ignore[name-defined]  # the pure-Python one: no C memo table
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.names: set[str] = set()

    def find_class(self, module: str, name: str) -> type:
        self.names.add(f"{module}.{name}")
        return _Inert

    def persistent_load(self, pid: Any) -> _Inert:
        return _Inert()


def _resolved(data: bytes) -> set[str]:
    recorder = _Recorder(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            recorder.load()
        except Exception:  # noqa: BLE001 - a broken stream still resolved what it resolved before breaking
            pass
    return recorder.names


def _fixture_pickles() -> list[tuple[str, bytes]]:
    found = []
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file()):
        try:
            with zipfile.ZipFile(path) as z:
                found += [(f"{path.relative_to(FIXTURES)}:{n}", z.read(n)) for n in z.namelist() if n.endswith(".pkl")]
        except zipfile.BadZipFile:
            if path.read_bytes()[:1] == b"\x80":
                found.append((str(path.relative_to(FIXTURES)), path.read_bytes()))
    return found


#: The corpus: each distinct pickle once (the farm's fixtures repeat most of them byte for byte),
#: then an even sample of at most this many in name order, so that the time per context stays
#: within the inspect tests' alarm however many releases the farm adds.
MAX_PICKLES = 48


def _sample(found: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    unique: dict[bytes, tuple[str, bytes]] = {}
    for name, data in found:
        unique.setdefault(hashlib.sha256(data).digest(), (name, data))
    ordered = sorted(unique.values())
    return ordered[:: max(1, -(-len(ordered) // MAX_PICKLES))]


PICKLES = _sample(_fixture_pickles())


def test_the_fixtures_hold_pickles_of_every_kind() -> None:
    names = " ".join(n for n, _ in PICKLES)
    assert len(PICKLES) >= 20 and ".metadata" in names and "data.pkl" in names


@pytest.mark.parametrize("context", sorted(ALLOWLISTS))
def test_a_stream_the_reader_passes_resolves_only_what_it_reported(context: str) -> None:
    passed = 0
    for name, original in PICKLES:
        for seed in range(SEEDS):
            rng = random.Random(f"{name}:{seed}")
            data, how = original, []
            for _ in range(rng.choice([0, 1, 1, 2])):  # seed 0-ish cases keep the producer's own stream
                data, step = (mutate_pickle_values if rng.random() < 0.5 else mutate_bytes)(data, rng)
                how.append(step)
            report = read_pickle(data, path=name, context=context)
            if not report.inside_allowlist:
                continue
            passed += 1
            reported = set(report.globals) | {c.target for c in report.calls}
            unseen = _resolved(data) - reported
            assert not unseen, f"{name} seed {seed} ({'; '.join(how)}): the reader missed {sorted(unseen)}"
    assert passed > 0  # some streams stay inside this context's allowlist, so the comparison ran
