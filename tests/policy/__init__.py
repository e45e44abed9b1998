"""Tests of the policy pack (policy/)."""
from __future__ import annotations

from policy import rules


def rule_named(name: str) -> rules.Rule:
    """The pack's rule of that name: the pack itself only registers rules.RULES in order."""
    (found,) = [r for r in rules.RULES if r.name == name]
    return found
