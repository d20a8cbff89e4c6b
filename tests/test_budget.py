import math

import pytest
import torch

from budgeted_attention.budget import parse_budgets, validate_budget


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.0000001, 2, math.nan, math.inf, -math.inf, "0.5", None, True, [0.5]])
def test_invalid_budgets_are_rejected_with_the_value_named(bad):
    with pytest.raises(ValueError) as info:
        validate_budget(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("good", [1e-6, 0.1, 0.5, 1, 1.0, torch.tensor(0.25)])
def test_valid_budgets_pass(good):
    assert 0 < validate_budget(good) <= 1


def test_parse_budgets():
    assert parse_budgets("0.25, 0.5,0.75") == [0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="'abc'"):
        parse_budgets("0.5,abc")
    with pytest.raises(ValueError, match="1.5"):
        parse_budgets("0.5,1.5")


def test_numpy_scalars_are_numbers_but_bools_are_not():
    import numpy as np

    assert validate_budget(np.float32(0.5)) == 0.5 and validate_budget(np.int64(1)) == 1.0
    with pytest.raises(ValueError):
        validate_budget(np.float64("nan"))


def test_check_budgets_names_the_key():
    from budgeted_attention.config import check_budgets
    from budgeted_attention.errors import ConfigError

    assert check_budgets([1, 0.5], "budgets") == [1.0, 0.5]
    with pytest.raises(ConfigError, match=r"static_budgets\[1\].*nan"):
        check_budgets([0.5, math.nan], "static_budgets")
    with pytest.raises(ConfigError, match="at least one"):
        check_budgets([], "budgets")
    assert check_budgets([], "bench.budgets", allow_empty=True) == []
