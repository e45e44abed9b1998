"""The shipped stack files as the tests read them (deploy.stack_file's reader, secrets marked)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from deploy import plan, stack_file


def read_stack_file(stack: str, root: Path | None = None) -> dict[str, Any]:
    """The config: section of Pulumi.<stack>.yaml; secret values read as "[secret]"."""
    parsed = stack_file.read(plan.stack_path(stack, root))
    return {**parsed.config, **{key: "[secret]" for key in parsed.secrets}}
