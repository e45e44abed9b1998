"""docs/operations.md's table of what typical changes do to a running stack is the update diff's output."""
from __future__ import annotations

from pathlib import Path

from deploy import change_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
MARKER = "<!-- change table: python -m deploy.change_table -->\n"


def test_the_change_table_is_the_update_diffs_verdicts_and_covers_the_typical_changes():
    """One test: the table takes ~10 s of planning to build, once."""
    table = change_table.markdown_table()
    text = DOC.read_text()
    assert text.count(MARKER) == 1
    shown = text.split(MARKER, 1)[1].split("\n\n", 1)[0] + "\n"
    assert shown == table, "run `python -m deploy.change_table` and paste it under the marker"
    labels = [label for label, _, _ in change_table.CHANGES]
    assert len(labels) >= 12 and len(set(labels)) == len(labels)
    rows = table.splitlines()[2:]
    assert len(rows) == len(labels)
    assert any("VERSION" in r for r in rows if r.startswith("| Kubernetes version +2"))
    assert not any("DATA" in r or "COLLISION" in r or "STALE" in r for r in rows)
    assert any("CRDS" in r for r in rows if r.startswith("| KubeRay version"))
