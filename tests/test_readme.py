"""The README and docs/ stay true: the README's commands are the ones CI runs, the generated tables
are the declarations, every relative link and #anchor resolves, and the README stays a first visit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.config import markdown_tables
from facts.errors import markdown_table as exit_codes_table
from trainer.config.flags import markdown_table as trainer_flags_table

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # every page a reader follows links in
README_MAX_LINES = 300


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(python3 -m venv .*)$", README, flags=re.M)
    test_command = next(c for c in commands if c.endswith("python -m pytest"))
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_the_readme_fits_a_first_visit():
    """Everything else lives in docs/, one topic per file; the README points there."""
    lines = len(README.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move a section to docs/"


def generated_table(page: str, marker: str) -> str:
    """The table under `marker` in docs/`page`; the marker appears exactly once in the README and docs/."""
    counts = {p.relative_to(REPO).as_posix(): p.read_text().count(marker) for p in PAGES}
    assert sum(counts.values()) == 1 and counts.get(f"docs/{page}") == 1, \
        f"the marker {marker.strip()} must appear once, in docs/{page}; found {counts}"
    return (REPO / "docs" / page).read_text().split(marker, 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("name", sorted(markdown_tables()))
def test_each_configuration_table_is_the_declarations_in_full(name):
    """Every row, default and meaning: `python -m deploy.config` prints what belongs under the marker."""
    table = generated_table("configuration.md", f"<!-- {name} table: python -m deploy.config -->\n")
    assert table == markdown_tables()[name], "run `python -m deploy.config` and paste its table under the marker"


@pytest.mark.parametrize(("page", "marker", "table"), [
    ("training.md", "<!-- training flags table: python -m trainer flags -->\n", trainer_flags_table),
    ("troubleshooting.md", "<!-- exit codes table: python -m facts.errors -->\n", exit_codes_table),
], ids=["training flags", "exit codes"])
def test_the_trainer_tables_are_the_declarations_in_full(page, marker, table):
    """Every flag, its default, TRL keys and meaning; every exit code: the commands print what belongs under the marker."""
    shown = generated_table(page, marker)
    assert shown == table(), f"run `{marker.split(': ', 1)[1].removesuffix(' -->' + chr(10))}` and paste its table"


# --- links ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", flags=re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.M)


def prose(text: str) -> str:
    """The text a reader sees as Markdown: fenced code blocks and code spans left out."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors as its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """Each relative link of `page` whose file is missing, or whose #anchor no heading of its target gives
    (paths in the messages relative to `root`)."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):  # https:, mailto:, ...: not ours to check
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(root) if linked.is_relative_to(root) else linked}")
        elif anchor and (linked.is_dir() or linked.suffix != ".md"):
            broken.append(f"{target}: an anchor into a file that is not Markdown")
        elif anchor and anchor not in anchors(linked):
            broken.append(f"{target}: no heading of {linked.relative_to(root)} has the anchor #{anchor}")
    return broken


def test_the_slug_rules_are_githubs():
    assert slug("Set up (two commands)") == "set-up-two-commands"
    assert slug("AWS account and credentials (`aws:` settings)") == "aws-account-and-credentials-aws-settings"
    assert slug("What it builds, and why") == "what-it-builds-and-why"
    assert slug("Checking the data: `trainer data`") == "checking-the-data-trainer-data"
    assert slug("snake_case and dash-ed") == "snake_case-and-dash-ed"


def test_the_pages_are_the_readme_and_docs():
    names = [p.relative_to(REPO).as_posix() for p in PAGES]
    assert names[0] == "README.md" and "docs/README.md" in names and len(names) > 2


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    """The check itself: a missing file, a missing anchor in another page and in the page itself."""
    (tmp_path / "other.md").write_text("# Other page\n\n## A section, with punctuation!\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n"
                    "[ok](other.md) [ok](other.md#a-section-with-punctuation) [ok](#here) [web](https://example.com/x)\n"
                    "`[not a link](missing.md)`\n\n```\n[in a code block](missing.md)\n```\n\n"
                    "[gone](missing.md) [bad](other.md#a-section) [bad](#nowhere)\n")
    assert broken_links(page, root=tmp_path) == [
        "missing.md: no file missing.md",
        "other.md#a-section: no heading of other.md has the anchor #a-section",
        "#nowhere: no heading of page.md has the anchor #nowhere",
    ]


# --- what the code says about the docs --------------------------------------------------------------

NAMED_PAGE = re.compile(r"\b(docs/[\w-]+\.md)(?:, \"?([A-Z][\w /-]*?)\"?[).;:\n])?")
SOURCES = [p for folder in ("trainer", "deploy", "infra", "workloads", "facts", "policy", "tests")
           for p in sorted((REPO / folder).rglob("*.py")) if p.name != "test_readme.py"] + sorted(REPO.glob("Pulumi.*.yaml"))


def test_every_docs_page_and_section_the_code_names_exists():
    """Messages, help and docstrings that send a reader to `docs/PAGE.md, Section` name a page and a heading there."""
    named = [(path, page, section) for path in SOURCES for page, section in NAMED_PAGE.findall(path.read_text())]
    assert named, "no source names a docs page"
    wrong = []
    for path, page, section in named:
        where = path.relative_to(REPO).as_posix()
        if not (REPO / page).is_file():
            wrong.append(f"{where}: {page} does not exist")
        elif section and not any(h == section or h.startswith(section + " ")
                                 for h in HEADING.findall(FENCE.sub("", (REPO / page).read_text()))):
            wrong.append(f"{where}: {page} has no heading {section!r}")
    assert wrong == []
