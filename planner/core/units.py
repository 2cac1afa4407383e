"""Human byte units, parsed and printed here and nowhere else.

``GB``/``MB``/``KB`` are powers of 10, ``GiB``/``MiB``/``KiB`` powers of 2, a bare number is
bytes (docs/architecture.md, "Budget meaning"). Everything inside the library is an ``int``
of bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal

from planner.core.errors import BudgetError

__all__ = ["format_bytes", "format_bytes_apart", "parse_bytes"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse ``"12GB"``, ``"1.5GiB"``, ``"800MiB"`` or ``"123456"`` into a positive byte count.

    Raises :class:`BudgetError` for an unknown unit, a non-number, or a value that is not
    positive (a budget of zero bytes cannot hold the parameters).
    """
    match = _PATTERN.match(text)
    if match is None:
        raise BudgetError(
            f"cannot read {text!r} as a memory size; write a number with an optional unit, "
            "e.g. 12GB, 1.5GiB, 800MiB or 123456 (bytes)"
        )
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise BudgetError(
            f"unknown unit {unit!r} in {text!r}; use B, KB, MB, GB, TB (powers of 10) "
            "or KiB, MiB, GiB, TiB (powers of 2)"
        )
    value = Decimal(number) * factor  # exact: "2.01GB" is 2010000000 bytes, not 2009999999
    if value < 1:
        raise BudgetError(f"a memory size must be positive (at least 1 byte), got {text!r}")
    return int(value)


def format_bytes(size_bytes: int | float, *, binary: bool = True, decimals: int = 2) -> str:
    """Format a byte count for people: ``format_bytes(3 * 2**20) == "3.00 MiB"``.

    ``decimals`` digits after the point (bytes are always whole)."""
    base, names = (
        (1024, ("B", "KiB", "MiB", "GiB", "TiB"))
        if binary
        else (
            1000,
            ("B", "KB", "MB", "GB", "TB"),
        )
    )
    value = float(size_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for name in names:
        if value < base or name == names[-1]:
            return (
                f"{sign}{value:.0f} {name}" if name == "B" else f"{sign}{value:.{decimals}f} {name}"
            )
        value /= base
    raise AssertionError("unreachable")


def format_bytes_apart(*sizes_bytes: int, binary: bool = True) -> tuple[str, ...]:
    """Format sizes that are compared in one message so that different sizes read differently.

    Two decimals as :func:`format_bytes`, more where two different sizes would print the
    same (a budget a few bytes under the smallest that fits), and whole byte counts where
    four decimals are not enough:
    ``format_bytes_apart(300 * 2**20 - 300, 300 * 2**20) == ("299.9997 MiB", "300.0000 MiB")``
    and ``format_bytes_apart(10**9, 10**9 + 10) == ("1,000,000,000 bytes", "1,000,000,010
    bytes")``.
    """
    distinct = len(set(sizes_bytes))
    for decimals in (2, 3, 4):
        texts = tuple(format_bytes(size, binary=binary, decimals=decimals) for size in sizes_bytes)
        if len(set(texts)) == distinct:
            return texts
    return tuple(f"{size:,} bytes" for size in sizes_bytes)
