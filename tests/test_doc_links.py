"""Every relative link in README.md, docs/ and the READMEs in the package resolves: the file exists in the repository and, for a
`#fragment` into a Markdown file, that file has a heading with that anchor (GitHub's slugs). Nothing
names a file the repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# README.md, docs/ and the READMEs beside the code (chunkstore/webui/, its vendor/ folder)
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "chunkstore").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", path.read_text())
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(doc):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists() or not path.is_relative_to(REPO):
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: no heading #{fragment} in {path.name}")
    assert not broken, f"{doc.name}: " + "; ".join(broken)


def test_the_checker_sees_links_and_anchors(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Quick start: `serve`\n\n[x](b.md#top) [y](https://example.org) `[z](c.md)`\n"
                   "```\n[in code](nowhere.md)\n```\n")
    assert links(doc) == ["b.md#top", "https://example.org", "c.md"]
    assert anchors(doc) == {"quick-start-serve"}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_document_speaks_of_the_project_not_of_its_tickets(path):
    """The repository stands alone: its documents name no issue, ticket or pull request."""
    found = re.findall(r"\b(?:issue|ticket|pull request|PR) ?#?\d+", path.read_text(), re.I)
    assert not found, found
