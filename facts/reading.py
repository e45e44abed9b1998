"""What every reader of a user's file shares, so that each bad file ends in one `error:` line.

Bounded messages (a value is cut, with its length, never echoed whole); characters that look
like others, or show as nothing, named with their code point; bytes that are not UTF-8 named
by line and byte; and a mixin for a PyYAML loader (this module imports no yaml: the readers
pass their loader class) that bounds a document's nesting depth and its size with aliases
expanded (a "billion laughs" file), and refuses the YAML 1.1 forms that other YAML readers
take differently: `010` (octal 8 in YAML 1.1, 10 in YAML 1.2 and to a person), `1:30`
(sexagesimal 90), `1_000`, and `yes`/`no`/`on`/`off`/`y`/`n` as booleans.
"""
from __future__ import annotations

import re
import unicodedata

MAX_DEPTH = 64  # mappings and lists inside each other
MAX_NODES = 100_000  # values of the document, each alias counted as what it expands to
CLIP = 120  # characters of a value shown in a message

_YAML11_INT = re.compile(r"[-+]?(0[0-9_]+|0b[01_]+|[0-9][0-9_]*(:[0-5]?[0-9])+|[0-9]+_[0-9_]*)")
_YAML12_BOOL = ("true", "True", "TRUE", "false", "False", "FALSE")


class InputLimit(ValueError):
    """A file beyond what a reader accepts: too deep, too large with aliases expanded, or not UTF-8."""


def clip(value: object, limit: int = CLIP) -> str:
    """`value`'s repr, cut to `limit` characters with its length when longer."""
    return clip_text(repr(value), limit)


def clip_text(text: str, limit: int = CLIP) -> str:
    """`text` cut to `limit` characters with its length when longer."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def odd_characters(text: str, limit: int = 3) -> str:
    """The characters of `text` outside printable ASCII, with position and Unicode name ('' when none).

    A key spelled with a Cyrillic 'а' or a zero-width space looks like the right one; this says why it is not.
    """
    found = [(i, c) for i, c in enumerate(text) if not (" " <= c <= "~")]
    if not found:
        return ""
    named = [f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')} at position {i}" for i, c in found[:limit]]
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return f"it contains {', '.join(named)}{more}: characters that look like plain ones, or show as nothing"


def decode_utf8(data: bytes) -> str:
    """The text of a file's bytes (a UTF-8 BOM dropped); InputLimit naming the line and the byte when not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputLimit(f"line {line}: byte {data[e.start:e.start + 1]!r} is not UTF-8; save the file as "
                         f"UTF-8") from None


def yaml11_problem(tag: str, text: str) -> str | None:
    """Why a plain scalar means one thing to YAML 1.1 (PyYAML) and another to YAML 1.2 readers, or None."""
    if tag.endswith(":bool") and text not in _YAML12_BOOL:
        return (f"{text!r} is a boolean only in YAML 1.1 (other readers take it as the string {text!r}); "
                f"write true or false, or quote it")
    if tag.endswith(":int") and _YAML11_INT.fullmatch(text):
        return (f"{text!r} is a number YAML 1.1 reads in another base or notation than YAML 1.2 readers "
                f"and people do (010 is 8 there, 1:30 is 90); write it in plain decimal, or quote it")
    return None


class BoundedYaml:
    """Mixin for a yaml.SafeLoader subclass: nesting and expanded size bounded, YAML 1.1 surprises collected.

    `self.yaml11` lists `line N: problem` for each scalar yaml11_problem names; the reader reports them.
    """

    max_depth = MAX_DEPTH
    max_nodes = MAX_NODES

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if hasattr(cls, "add_constructor"):
            for kind in ("int", "bool"):
                cls.add_constructor(f"tag:yaml.org,2002:{kind}", cls._checked_scalar)

    def compose_node(self, parent, index):
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > self.max_depth:
                mark = self.peek_event().start_mark
                raise InputLimit(f"line {mark.line + 1}: nested more than {self.max_depth} levels deep; a "
                                 f"configuration file is a few levels of keys")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            size = _expanded_size(node, {}, self.max_nodes)
            if size > self.max_nodes:
                raise InputLimit(f"holds more than {self.max_nodes:,} values with its aliases (*name) expanded; "
                                 f"write the values out, or use fewer aliases")
        return node

    def _checked_scalar(self, node):
        problem = yaml11_problem(node.tag, node.value) if node.style is None else None
        if problem:
            if not hasattr(self, "yaml11"):
                self.yaml11 = []
            self.yaml11.append(f"line {node.start_mark.line + 1}: {problem}")
        kind = node.tag.rsplit(":", 1)[-1]
        return getattr(super(), f"construct_yaml_{kind}")(node)


def _expanded_size(node, memo: dict, limit: int) -> int:
    """Values below `node` with each alias counted as the subtree it names (memoised: shared nodes are one object)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = limit + 1  # a node inside itself (a recursive alias) is over any limit
    total = 1
    children = node.value if isinstance(node.value, list) else []
    for child in children:
        for part in (child if isinstance(child, tuple) else (child,)):
            total += _expanded_size(part, memo, limit)
            if total > limit:
                break
        if total > limit:
            break
    memo[key] = total
    return total
