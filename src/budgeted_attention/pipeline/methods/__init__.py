"""The methods of the pipeline, registered here and nowhere else.

A method is a :class:`~budgeted_attention.pipeline.methods.base.Method`: the ``methods`` values
it answers to, the methods it starts from, a config check and its units per seed (each with its
work and its contribution to the outputs). :data:`METHODS` is the registry; its order is the
order of every seed's units, so a method is registered after the methods it ``requires``. Adding
a method is one module (or a class in the module of its kin) and one entry here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from budgeted_attention.errors import ConfigError
from budgeted_attention.pipeline.methods.base import Method
from budgeted_attention.pipeline.methods.budgeted import Budgeted, Scratch
from budgeted_attention.pipeline.methods.dense import Dense, DenseLong
from budgeted_attention.pipeline.methods.hard import BudgetedHard
from budgeted_attention.pipeline.methods.ladder import Ladder
from budgeted_attention.pipeline.methods.posthoc import Posthoc, Recovered
from budgeted_attention.pipeline.methods.routed import Routed
from budgeted_attention.pipeline.methods.static import Static
from budgeted_attention.pipeline.units import Unit

if TYPE_CHECKING:
    from budgeted_attention.pipeline.config import ExperimentConfig

METHODS: tuple[Method, ...] = (
    Dense(), DenseLong(), Budgeted(), BudgetedHard(), Budgeted("-sandwich"), BudgetedHard("-sandwich"), Scratch(), Static(), Posthoc(),
    Recovered("posthoc-recovered"), Recovered("posthoc-recovered-1ep"), Ladder(), Routed(),
)
REGISTRY: dict[str, Method] = {name: method for method in METHODS for name in method.names}
ALL_METHODS: list[str] = list(REGISTRY)


def check_method_names(methods: list[str]) -> None:
    """Refuse an empty list or an unknown method (the message lists the known ones)."""
    unknown = [m for m in methods if m not in REGISTRY]
    if unknown:
        raise ConfigError(f"unknown method {unknown[0]!r} (known: {', '.join(ALL_METHODS)})")
    if not methods:
        raise ConfigError("methods must list at least one method")


def check_methods(cfg: ExperimentConfig) -> None:
    """The own checks of every method the config lists."""
    for method in METHODS:
        if set(method.names) & set(cfg.methods):
            method.check(cfg)


def planned(methods: list[str]) -> list[Method]:
    """The methods to run for the config's ``methods``: those listed and those they require, in registry order."""
    wanted = {REGISTRY[name] for name in methods}
    for method in reversed(METHODS):  # a method's requirements are registered before it
        if method in wanted:
            wanted |= {REGISTRY[name] for name in method.requires}
    return [method for method in METHODS if method in wanted]


def plan(cfg: ExperimentConfig) -> list[Unit]:
    """Every unit of the run in execution order: seed by seed, method by method."""
    methods = planned(cfg.methods)
    return [unit for seed in cfg.seeds for method in methods for unit in method.units(cfg, seed)]
