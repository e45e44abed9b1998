"""Stack files the README and docs/ show, read from the pages themselves so that what they show is what is tested."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def documented_stack(name: str) -> dict:
    """The `config:` of the one ```yaml block, in the README or a page of docs/, that starts with `# Pulumi.<name>.yaml`."""
    found = [(page, block) for page in PAGES for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)
             if block.startswith(f"# Pulumi.{name}.yaml\n")]
    where = [page.relative_to(REPO).as_posix() for page, _ in found]
    assert len(found) == 1, (f"the README and docs/*.md hold {len(found)} ```yaml blocks starting with "
                             f"# Pulumi.{name}.yaml ({', '.join(where) or 'none'}); exactly one is tested")
    return yaml.safe_load(found[0][1])["config"]
