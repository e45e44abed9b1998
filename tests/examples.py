"""Stack files the README shows, read from the README itself so that what it shows is what is tested."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_stack(name: str) -> dict:
    """The `config:` of the README's ```yaml block that starts with `# Pulumi.<name>.yaml`."""
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S):
        if block.startswith(f"# Pulumi.{name}.yaml\n"):
            return yaml.safe_load(block)["config"]
    raise AssertionError(f"the README has no ```yaml block starting with # Pulumi.{name}.yaml")
