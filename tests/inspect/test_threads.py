"""map_in_threads: the order and the errors of a plain loop, with large items on a pool."""

from __future__ import annotations

import threading

import pytest

from ckptgate.inspect._threads import THREADED_MIN_BYTES, map_in_threads

BIG, SMALL = THREADED_MIN_BYTES, 1


def test_results_keep_item_order_and_large_items_run_on_the_pool(monkeypatch):
    monkeypatch.setattr("ckptgate.inspect._threads.os.cpu_count", lambda: 2)
    seen: dict[int, str] = {}

    def fn(x: tuple[int, int]) -> int:
        seen[x[0]] = threading.current_thread().name
        return x[0] * 10

    items = [(0, SMALL), (1, BIG), (2, SMALL), (3, BIG), (4, BIG)]
    assert map_in_threads(fn, items, lambda x: x[1]) == [0, 10, 20, 30, 40]
    main = threading.current_thread().name
    assert {seen[i] for i in (0, 2)} == {main}
    assert all(seen[i].startswith("ckptgate-inspect") for i in (1, 3, 4))


def test_the_first_error_in_item_order_propagates_after_every_item_ran(monkeypatch):
    monkeypatch.setattr("ckptgate.inspect._threads.os.cpu_count", lambda: 2)
    ran: list[int] = []

    def fn(x: tuple[int, int]) -> int:
        ran.append(x[0])
        if x[0] in (1, 3):
            raise ValueError(f"item {x[0]}")
        return x[0]

    with pytest.raises(ValueError, match="item 1"):
        map_in_threads(fn, [(0, SMALL), (1, BIG), (2, BIG), (3, SMALL)], lambda x: x[1])
    assert sorted(ran) == [0, 1, 2, 3]


def test_only_small_items_run_inline():
    main = threading.current_thread().name
    assert map_in_threads(lambda x: threading.current_thread().name, [SMALL] * 5, lambda x: x) == [main] * 5
