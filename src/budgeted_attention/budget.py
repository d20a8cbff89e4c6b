"""Validation of attention budgets and budget lists."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

from budgeted_attention.errors import BudgetError


def validate_budget(budget: object) -> float:
    """Return ``budget`` as a float if it is a finite number in (0, 1].

    Accepts Python and NumPy ints and floats and one-element tensors; never a bool.

    Raises:
        BudgetError: (a ValueError) naming the bad value, for non-numbers, NaN, infinities and values outside (0, 1].
    """
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        try:
            import torch  # noqa: PLC0415 - a tensor budget means torch is loaded; the package import stays torch-free

            if isinstance(budget, torch.Tensor) and budget.numel() == 1:
                return validate_budget(float(budget.item()))
        except ImportError:  # pragma: no cover - torch is a hard dependency
            pass
        raise BudgetError(f"budget must be a finite number in (0, 1], got {budget!r}")
    value = float(budget)
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise BudgetError(f"budget must be a finite number in (0, 1], got {budget!r}")
    return value


def parse_budgets(text: str | Iterable[object]) -> list[float]:
    """Parse a comma-separated budget list (``"0.25,0.5"``) or an iterable into validated floats."""
    if isinstance(text, str):
        items: list[object] = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                items.append(float(part))
            except ValueError:
                raise BudgetError(f"budget must be a finite number in (0, 1], got {part!r}") from None
    else:
        items = list(text)
    if not items:
        raise BudgetError(f"expected at least one budget, got {text!r}")
    return [validate_budget(item) for item in items]
