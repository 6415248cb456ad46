"""Helpers for the inspect tests: a per-test alarm (no hang) and tiny builders."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def _alarm() -> Iterator[None]:
    def boom(signum: int, frame: object) -> None:
        raise TimeoutError("test exceeded its alarm: something hung")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
