"""Every declared training flag is read by the code it configures.

A TrainConfig field that nothing reads is a flag that --help, the YAML reader and the flags table
all offer and that silently changes nothing. Read statically (no training run): a field counts as
read when some module outside trainer/config/ loads it as an attribute (`cfg.lr`, any `.lr`, or
getattr(x, "lr")), or when a TrainConfig property or method that reads it (self.lr, directly or
through another member) is itself used outside trainer/config/.
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path
from typing import Iterable

from tests.guards import parse_python

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "trainer" / "config"


def attribute_reads(tree: ast.AST, owner: str | None = None) -> set[str]:
    """Names loaded as attributes (of `owner` only, when given) or read with getattr(x, "name")."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if owner is None or (isinstance(node.value, ast.Name) and node.value.id == owner):
                found.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and owner is None):
            found.add(node.args[1].value)
    return found


def flag_reads(config_source: str, outside: Iterable[str], class_name: str = "TrainConfig") -> tuple[set, set]:
    """(declared fields nothing reads, declared fields that are read) of `class_name` in `config_source`,
    given the sources of every module outside the configuration."""
    (klass,) = [n for n in parse_python(config_source).body if isinstance(n, ast.ClassDef) and n.name == class_name]
    declared = {n.target.id for n in klass.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    members = {n.name: attribute_reads(n, "self") | attribute_reads(n, "cls") for n in klass.body
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    read = set().union(*(attribute_reads(parse_python(source)) for source in outside))
    used, todo = set(), [m for m in members if m in read]
    while todo:  # members used outside, and the members they use
        member = todo.pop()
        if member not in used:
            used.add(member)
            todo.extend(m for m in members[member] if m in members)
    via_members = set().union(*(members[m] for m in used))
    found = {name for name in declared if name in read or name in via_members}
    return declared - found, found


def _outside_sources() -> list[str]:
    return [p.read_text() for p in sorted((REPO / "trainer").rglob("*.py")) if CONFIG not in p.parents]


def test_every_declared_training_flag_is_read_by_the_code_it_configures():
    from trainer.config.flags import TrainConfig

    unread, found = flag_reads((CONFIG / "flags.py").read_text(), _outside_sources())
    assert unread | found == {f.name for f in fields(TrainConfig)}  # the checker sees every declared field
    assert not unread, (f"declared in TrainConfig but read nowhere outside trainer/config/: {sorted(unread)}; "
                        f"wire each to the code it configures, or remove it")
    assert {"lr", "adam_beta1", "adam_beta2", "adam_epsilon", "warmup_ratio", "run_name"} <= found


def test_the_checker_reports_a_flag_nothing_reads():
    config = '''
class TrainConfig:
    lr: float = setting(1e-5, "peak learning rate")
    warmup_steps: int = setting(0, "warm-up")
    run_name: str = setting(None, "name")
    by_name: int = setting(0, "read with getattr")
    forgotten: int = setting(0, "declared, wired to nothing")

    def warmup_for(self, total):
        return self.warmup_steps

    @property
    def resolved_name(self):
        return self.run_name

    @property
    def uri(self):
        return self.resolved_name

    @property
    def never_used(self):
        return self.forgotten
'''
    outside = ["def step(cfg):\n    return cfg.lr * cfg.warmup_for(10)\n",
               "def where(c):\n    return c.uri, getattr(c, 'by_name')\n"]
    assert flag_reads(config, outside) == ({"forgotten"}, {"lr", "warmup_steps", "run_name", "by_name"})
    # a write is not a read, and a read inside the configuration alone does not count
    assert flag_reads(config, ["def f(cfg):\n    cfg.lr = 1\n"])[0] == \
        {"lr", "warmup_steps", "run_name", "by_name", "forgotten"}


def test_a_flag_planted_in_the_real_declarations_is_reported():
    source = (CONFIG / "flags.py").read_text()
    anchor = "@dataclass(frozen=True)\nclass TrainConfig:\n"
    assert source.count(anchor) == 1
    planted = source.replace(anchor, anchor + '    planted_flag: int = setting(0, "nothing reads this")\n')
    unread, found = flag_reads(planted, _outside_sources())
    assert unread == {"planted_flag"} and len(found) > 40
