"""Byte-size parsing and formatting."""

import pytest

from tracekit.errors import UsageError
from tracekit.units import format_size, parse_size


@pytest.mark.parametrize("text,value", [
    ("6GiB", 6 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096),
    ("2 MiB", 2 * 2**20), ("1k", 1024), ("0", 0),
])
def test_parse(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-1GiB", "5 parsecs", "1.2.3"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="invalid capacity"):
        parse_size(text, "capacity")


def test_format() -> None:
    assert format_size(512) == "512 bytes"
    assert format_size(20 * 2**20) == "20.00 MiB"
    assert format_size(150_109_880_320) == "139.80 GiB"
