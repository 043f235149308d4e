"""Reading the project's markdown pages as GitHub renders them, for the tests that check them (tests/test_docs_links.py,
tests/deploy/test_runbooks.py): the anchor of a heading, and a page with its fenced code blanked so that a ``#``
comment in a shell block is not taken for a heading."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text in lower case, every character other than a letter, a digit, ``_``,
    ``-`` or a space dropped (backticks, dots, colons, ...), each space turned into ``-``. (GitHub appends ``-1``,
    ``-2`` to repeated anchors; tests/test_docs_links.py's ``anchors`` does that.)"""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def blank(match: re.Match[str]) -> str:
    """The matched text as spaces, its newlines kept: line numbers after it stay right."""
    return re.sub(r"[^\n]", " ", match.group(0))


def without_fences(text: str) -> str:
    """``text`` with every fenced code block (``` or ~~~, indented up to 3 spaces) blanked by ``blank``."""
    return _FENCE.sub(blank, text)
