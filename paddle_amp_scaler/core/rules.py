"""The loss-scaling rules by name: the one place where ``policy="headroom"`` becomes a
type. Everything past the constructor and the state dict asks the rule itself."""

from __future__ import annotations

from . import validation
from .headroom import HeadroomRule
from .interval import IntervalRule, Rule

RULES: dict[str, type[Rule]] = {rule.name: rule for rule in (IntervalRule, HeadroomRule)}


def rule_named(name: object, argument: str = "policy") -> type[Rule]:
    """The rule type called ``name``; ``ValueError`` naming ``argument`` and the names."""
    return RULES[validation.check_choice(name, argument, tuple(RULES))]
