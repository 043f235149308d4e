"""README.md and every docs/*.md page: each relative markdown link ``[text](target)`` resolves, and README.md stays a
front door.

A link resolves when its file exists in the repository, relative to the page that links it, and its ``#anchor``
(also an in-page ``(#anchor)``) is the GitHub anchor of a heading of the target page. Headings and links inside
fenced code blocks and inline code are not headings and links. ``http(s):`` and ``mailto:`` targets are not checked
(nothing here may reach the network).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.markdown import blank, github_anchor, without_fences

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
FRONT_DOOR_MAX_LINES = 200

_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_UNCHECKED = re.compile(r"(?i)^(https?|mailto):")


def prose(text: str) -> str:
    """The page without fenced code blocks and inline code (a ``# comment`` in a shell block is no heading)."""
    return _CODE_SPAN.sub(blank, without_fences(text))


def anchors(text: str) -> set[str]:
    """Every anchor GitHub gives the page's headings: a repeated one gets ``-1``, ``-2``, ... as github-slugger does
    (a suffixed anchor that is taken already moves on to the next number)."""
    occurrences: dict[str, int] = {}
    for heading in _HEADING.findall(without_fences(text)):
        slug = base = github_anchor(heading)
        while slug in occurrences:
            occurrences[base] += 1
            slug = f"{base}-{occurrences[base]}"
        occurrences[slug] = 0
    return set(occurrences)


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link and image outside code."""
    body = prose(text)
    return [(body.count("\n", 0, m.start()) + 1, m.group(1)) for m in _LINK.finditer(body)]


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """One line per relative link of ``page`` that does not resolve, saying why."""
    problems = []
    text = page.read_text(encoding="utf-8")
    for line, target in links(text):
        if _UNCHECKED.match(target):
            continue
        path, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{line}: ({target})"
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where} leaves the repository")
        elif not dest.exists():
            problems.append(f"{where} no such file")
        elif anchor:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{where} an anchor into a file that is not a markdown page")
            elif anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where} no heading of {dest.relative_to(root.resolve())} has that anchor")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_pages_link_to_each_other() -> None:
    """The link check has links to check: README and the hand-written pages link across pages and within them."""
    targets = [t for p in PAGES for _, t in links(p.read_text(encoding="utf-8"))]
    assert any(t.startswith("docs/") for t in targets)
    assert any(".md#" in t for t in targets) and any(t.startswith("#") for t in targets)


def test_the_readme_is_a_front_door() -> None:
    """Short enough to read in a few minutes, with a link to every page under docs/."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < FRONT_DOOR_MAX_LINES
    linked = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(text) if not _UNCHECKED.match(t)}
    unlinked = sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked)
    assert unlinked == [], f"docs pages README.md does not link: {unlinked}"


def test_the_readme_keeps_the_two_commands() -> None:
    section = README.read_text(encoding="utf-8").split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert "make run" in section and "make test" in section


# ---- the checker itself, on small pages -----------------------------------------------------------------------------
TARGET = """# Title

## Same
## Same
```sh
# not a heading
```
## `code`: and punctuation.
"""


@pytest.mark.parametrize(
    ("link", "problem"),
    [
        ("[ok](target.md)", None),
        ("[ok](target.md#title)", None),
        ("[repeat](target.md#same-1)", None),
        ("[code](target.md#code-and-punctuation)", None),
        ("[in page](#here)", None),
        ("[web](https://example.com/nowhere.md#none)", None),
        ("`[code span](missing.md)`", None),
        ("[missing](missing.md)", "no such file"),
        ("[anchor](target.md#nowhere)", "no heading of docs/target.md"),
        ("[third repeat](target.md#same-2)", "no heading of docs/target.md"),
        ("[fenced](target.md#not-a-heading)", "no heading of docs/target.md"),
        ("[in page](#nowhere)", "no heading of docs/page.md"),
        ("[out](../../outside.md)", "leaves the repository"),
        ("[anchor in a file](data.txt#x)", "not a markdown page"),
    ],
)
def test_the_checker_finds_broken_links(tmp_path: Path, link: str, problem: str | None) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "target.md").write_text(TARGET)
    (root / "docs" / "data.txt").write_text("x\n")
    page = root / "docs" / "page.md"
    page.write_text(f"# Page\n\n## Here\n\nSee {link}.\n")
    found = broken_links(page, root)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0] and "docs/page.md:5:" in found[0], found
