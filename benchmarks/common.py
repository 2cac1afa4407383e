"""Shared by the benchmark scripts."""

from __future__ import annotations

import pandas as pd


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table; missing values are empty cells. (pandas' own to_markdown
    needs an extra package.)"""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join("" if pd.isna(v) else str(v) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body])
