"""parse_bytes / format_bytes: the one place human byte units are read and written."""

from __future__ import annotations

import pytest

from planner.core.errors import BudgetError
from planner.core.units import format_bytes, format_bytes_apart, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [
        # Decimal units are powers of 10 ...
        ("12GB", 12 * 10**9),
        ("800MB", 800 * 10**6),
        ("3KB", 3_000),
        ("2TB", 2 * 10**12),
        # ... binary units powers of 2.
        ("1GiB", 2**30),
        ("800MiB", 800 * 2**20),
        ("4KiB", 4 * 2**10),
        ("1TiB", 2**40),
        # A bare number (or B) is bytes.
        ("123456", 123_456),
        ("1", 1),
        ("512B", 512),
        # Decimals.
        ("1.5GiB", 3 * 2**29),
        ("0.5GB", 500_000_000),
        (".5KB", 500),
        ("2.25MiB", 9 * 2**18),
    ],
)
def test_parse_bytes_units(text: str, expected_bytes: int) -> None:
    assert parse_bytes(text) == expected_bytes


@pytest.mark.parametrize("text", ["12gb", "12Gb", "12gB", " 12GB", "12GB ", " 12 GB ", "\t12GB\n"])
def test_parse_bytes_ignores_case_and_whitespace(text: str) -> None:
    assert parse_bytes(text) == 12 * 10**9


def test_parse_bytes_binary_unit_case_insensitive() -> None:
    assert parse_bytes("1gib") == parse_bytes("1GIB") == 2**30


def test_parse_bytes_returns_int() -> None:
    assert type(parse_bytes("1.5GiB")) is int


@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [("2.01GB", 2_010_000_000), ("2.03MB", 2_030_000), ("2.01KB", 2_010)],
)
def test_parse_bytes_exact_decimal(text: str, expected_bytes: int) -> None:
    assert parse_bytes(text) == expected_bytes


@pytest.mark.parametrize("text", ["", "GB", "abc", "12 34", "1e3", "twelve GB", "12..5GB"])
def test_parse_bytes_rejects_non_numbers(text: str) -> None:
    with pytest.raises(BudgetError) as raised:
        parse_bytes(text)
    message = str(raised.value)
    assert repr(text) in message
    # Says what to write instead.
    assert "12GB" in message
    assert "GiB" in message


@pytest.mark.parametrize("text", ["12XB", "12G", "12gigabytes", "5MBs"])
def test_parse_bytes_rejects_unknown_units(text: str) -> None:
    with pytest.raises(BudgetError) as raised:
        parse_bytes(text)
    message = str(raised.value)
    assert "unit" in message
    # Lists the units that are accepted.
    for unit in ("MB", "GB", "MiB", "GiB"):
        assert unit in message


@pytest.mark.parametrize("text", ["0", "-3GB", "0GB", "0.0MiB", "-1", "0.4"])
def test_parse_bytes_rejects_non_positive(text: str) -> None:
    with pytest.raises(BudgetError, match="positive") as raised:
        parse_bytes(text)
    assert repr(text) in str(raised.value)


def test_budget_error_is_a_planner_error() -> None:
    from planner.core.errors import PlannerError

    with pytest.raises(PlannerError):
        parse_bytes("12XB")


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (3 * 2**20, "3.00 MiB"),
        (3 * 2**29, "1.50 GiB"),
        (2**40, "1.00 TiB"),
        (2**50, "1024.00 TiB"),  # no unit beyond TiB
        (-2048, "-2.00 KiB"),
    ],
)
def test_format_bytes_binary(size_bytes: int, expected: str) -> None:
    assert format_bytes(size_bytes) == expected


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [
        (999, "999 B"),
        (1000, "1.00 KB"),
        (12 * 10**9, "12.00 GB"),
        (1_500_000, "1.50 MB"),
    ],
)
def test_format_bytes_decimal(size_bytes: int, expected: str) -> None:
    assert format_bytes(size_bytes, binary=False) == expected


@pytest.mark.parametrize("text", ["12GB", "1.5GiB", "800MiB", "3MB"])
def test_format_then_parse_round_trips_to_the_printed_precision(text: str) -> None:
    size_bytes = parse_bytes(text)
    binary = "i" in text
    printed = format_bytes(size_bytes, binary=binary).replace(" ", "")
    assert parse_bytes(printed) == pytest.approx(size_bytes, rel=0.005)


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        # Far apart: two decimals, as format_bytes.
        ((300 * 2**20, 301 * 2**20), ("300.00 MiB", "301.00 MiB")),
        # 300 bytes apart: 2 decimals would print 300.00 twice; 4 tell them apart.
        ((300 * 2**20 - 300, 300 * 2**20), ("299.9997 MiB", "300.0000 MiB")),
        # 5 bytes apart: byte counts.
        ((300 * 2**20 - 5, 300 * 2**20), ("314,572,795 bytes", "314,572,800 bytes")),
        # Equal sizes stay equal.
        ((2**20, 2**20), ("1.00 MiB", "1.00 MiB")),
    ],
)
def test_format_bytes_apart_prints_different_sizes_differently(
    sizes: tuple[int, int], expected: tuple[str, str]
) -> None:
    assert format_bytes_apart(*sizes) == expected
