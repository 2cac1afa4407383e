"""The documentation holds together: every section the code cites exists, and every relative
link in the README and docs/ points at a file and heading that exist.

Code cites documentation as ``docs/architecture.md, "Budget meaning"`` or
``the README's 'Model file' section``; a renamed heading would leave such a citation (or a
user-facing error message) pointing nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = sorted(
    path
    for folder in ("planner", "cli", "tests", "examples", "benchmarks")
    for path in (ROOT / folder).rglob("*.py")
)
DOCS_CITATION = re.compile(r"""docs/([\w-]+\.md),?\s*\(?"([^"]+)\"""")
README_CITATION = re.compile(r"""README(?:'s)?\s*\(?(['"])([^'"]+)\1""")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _headings(path: Path) -> list[str]:
    """The heading texts of a Markdown file, outside code blocks, without backticks."""
    headings, in_code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6}\s+(.*)", line)):
            headings.append(match.group(1).replace("`", "").strip())
    return headings


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    for heading in _headings(path):
        anchor = base = _anchor(heading)
        count = 1
        while anchor in anchors:
            anchor, count = f"{base}-{count}", count + 1
        anchors.add(anchor)
    return anchors


def _flattened(path: Path) -> str:
    """The file's text with line breaks (and comment markers after them) turned into spaces,
    so that a citation wrapped over two lines reads as one."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(encoding="utf-8"))


def test_the_documents_to_check_are_there() -> None:
    names = {path.name for path in DOCUMENTS}
    assert {"README.md", "architecture.md", "how-it-works.md", "bad_inputs.md"} <= names


@pytest.mark.parametrize("path", CODE, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_cited_section_exists(path: Path) -> None:
    text = _flattened(path)
    missing = []
    for name, section in DOCS_CITATION.findall(text):
        document = ROOT / "docs" / name
        if not document.is_file() or section not in _headings(document):
            missing.append(f'docs/{name}, "{section}"')
    for _, section in README_CITATION.findall(text):
        if section not in _headings(ROOT / "README.md"):
            missing.append(f'README, "{section}"')
    if "DESIGN" + ".md" in text:  # the design of record is docs/architecture.md
        missing.append("DESIGN" + ".md")
    assert not missing, f"{path.relative_to(ROOT)} cites sections that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    broken = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists() or (
            anchor and (linked.suffix != ".md" or anchor not in _anchors(linked))
        ):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} has broken links: {broken}"
