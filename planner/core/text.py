"""Text for messages and notes: pure Python, no torch."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["and_more"]


def and_more(names: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``names``, comma-separated, then how many are left out:
    ``"a, b, c and 2 more"``; all of them when there are no more than ``shown``."""
    text = ", ".join(names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")
