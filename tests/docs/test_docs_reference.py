"""The docs read as a reference, true today.

Every Markdown page a user reads (docs/*.md, README.md, the READMEs under
deploy/) is checked line by line, outside fenced code blocks:

- a relative link (``[text](path)``, ``[text](path#anchor)``) names a file
  that exists, and an anchor names a heading of that file;
- a repository path in backticks (``bench/run.py``, ``docs/x.md``) exists;
- no issue number ("issue 12", "(issue 12, part 1)", "issues #3"), no "(was)" or
  "(now)": the history is in git, the docs say what is;
- no section number of a platform spec that is not in the repository
  ("spec 4.9", "spec §2.7", "spec sections 4 and 5"): a doc says what the
  behaviour is instead.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PAGES = sorted(
    [
        *(ROOT / "docs").glob("*.md"),
        ROOT / "README.md",
        *(ROOT / "deploy").rglob("README*.md"),
    ]
)

#: Paths the docs name that a command creates (they are not in the tree).
GENERATED = ("bench/results/",)

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
REPO_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
ISSUE = re.compile(r"\bissues?\s*#\s*\d+|\bissues?\s+\d+", re.IGNORECASE)
WAS_NOW = re.compile(r"\((?:was|now)\)", re.IGNORECASE)
SPEC_SECTION = re.compile(
    r"\bspec(?:'s)?\s*(?:§\s*\d+(?:\.\d+)*|sections?\s+\d|\d+(?:\.\d+)*\b)|\bplatform spec\b",
    re.IGNORECASE,
)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose(page: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a page outside fenced code blocks."""
    fence = ""
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if not fence:
                fence = marker
            elif marker == fence:
                fence = ""
            continue
        if not fence:
            yield number, line


def _without_code(line: str) -> str:
    return CODE_SPAN.sub(" ", line)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading).strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for _, line in _prose(page):
        if not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _link_problem(page: Path, target: str) -> str | None:
    if SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, anchor = target.partition("#")
    linked = (page.parent / path_part).resolve() if path_part else page
    if not linked.exists():
        return f"link to a missing file: {target}"
    if anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
        return f"link to a missing heading: {target}"
    return None


def _repo_path_problem(root: Path, page: Path, span: str) -> str | None:
    """A span that looks like a path in this repository and does not exist."""
    if not REPO_PATH.fullmatch(span) or span.startswith(GENERATED):
        return None
    top = span.split("/", 1)[0]
    is_repo_path = "/" in span and not top.startswith(".") and (root / top).is_dir()
    if not is_repo_path and not span.endswith(".md"):
        return None
    if (root / span).exists() or (page.parent / span).exists():
        return None
    return f"path in backticks that does not exist: {span}"


def _problems(page: Path, root: Path = ROOT) -> Iterator[str]:
    for number, line in _prose(page):
        where = f"{page.relative_to(root)}:{number}"
        prose = _without_code(line)
        for match in LINK.finditer(prose):
            problem = _link_problem(page, match.group(1))
            if problem:
                yield f"{where}: {problem}"
        for match in CODE_SPAN.finditer(line):
            problem = _repo_path_problem(root, page, match.group(2).strip())
            if problem:
                yield f"{where}: {problem}"
        for pattern, what in (
            (ISSUE, "an issue number"),
            (WAS_NOW, "a (was)/(now) note"),
            (SPEC_SECTION, "a section of a spec that is not in the repository"),
        ):
            for match in pattern.finditer(prose):
                yield f"{where}: {what}: {match.group(0)!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_reads_as_a_reference(page: Path) -> None:
    problems = list(_problems(page))
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """Each rule fires on a line written to break it, and not on its look-alikes."""
    (tmp_path / "mgmt_api").mkdir()
    (tmp_path / "other.md").write_text("# A heading: with `code`\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "\n".join(
            [
                "# Title (issue 12)",
                "See [gone](missing.md) and [there](other.md#a-heading-with-code).",
                "And [no such heading](other.md#nope), [web](https://example.com/issues/3).",
                "Latency 3 ms (was) and 2 ms (now); see issue #7.",
                "The proxy diagnostics of spec 4.9 and spec §2.7.",
                "Set `spec.rateLimit` in `mgmt_api/no_such_module.py`.",
                "```",
                "issue 99 in a code block is an example, not a claim",
                "```",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    found = [problem.split(": ", 1)[1] for problem in _problems(page, tmp_path)]
    assert found == [
        "an issue number: 'issue 12'",
        "link to a missing file: missing.md",
        "link to a missing heading: other.md#nope",
        "an issue number: 'issue #7'",
        "a (was)/(now) note: '(was)'",
        "a (was)/(now) note: '(now)'",
        "a section of a spec that is not in the repository: 'spec 4.9'",
        "a section of a spec that is not in the repository: 'spec §2.7'",
        "path in backticks that does not exist: mgmt_api/no_such_module.py",
    ]
