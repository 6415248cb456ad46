"""Shared CLI option types."""

from __future__ import annotations

import click
import pytest

from ckptgate._cli._options import ByteSize


@pytest.mark.parametrize(("text", "size"), [
    ("2147483648", 2147483648), ("5GB", 5 * 10**9), ("500MB", 500 * 10**6), ("5gb", 5 * 10**9),
    ("2GiB", 2 << 30), ("1.5GiB", 3 << 29), ("10 KB", 10_000), ("64KiB", 65536), ("7B", 7), ("1TB", 10**12),
])
def test_sizes_are_read_as_huggingface_hub_and_iec_write_them(text, size):
    assert ByteSize().convert(text, None, None) == size


@pytest.mark.parametrize("text", ["", "GB", "5 XB", "-1GB", "0", "0.1B", "5GBs", "1e9"])
def test_anything_else_is_a_usage_error(text):
    with pytest.raises(click.BadParameter):
        ByteSize().convert(text, None, None)
