"""Text helpers for messages (pure)."""

from __future__ import annotations

from planner.core.text import and_more


def test_and_more_names_the_first_few_and_counts_the_rest() -> None:
    assert and_more(["a", "b", "c", "d", "e", "f"], 4) == "a, b, c, d and 2 more"
    assert and_more(["a", "b", "c", "d"], 4) == "a, b, c, d"
    assert and_more(["a"], 3) == "a" and and_more([], 3) == ""
