"""budgeted_attention: one transformer checkpoint, many cost/accuracy operating points.

A caller asks for a compute budget ``b`` in (0, 1]; budget-conditioned gates switch attention
heads (and FFN neuron groups) off to fit it, and pruning turns the budget into a physically
smaller model that runs faster. The public calls (see :mod:`budgeted_attention.api`)::

    import budgeted_attention as baa
    bm = baa.load("runs/demo")          # a run directory or a checkpoint file
    small = bm.prune(0.5)               # a physically smaller model
    baa.save(small, "small.safetensors")

Data flow (one subpackage per stage)::

    data -> model -> training -> pruning -> benchmark -> reporting -> serving
"""

from budgeted_attention.budget import validate_budget
from budgeted_attention.errors import BAAError, BudgetError, CheckpointError, ConfigError, DataError

__version__ = "0.3.2"

_API = ("Budgeted", "load", "save", "train", "wrap")


def __getattr__(name: str):
    # The API pulls in torch and the model code: loaded on first use, so `import
    # budgeted_attention` (and `baa --help`) stay fast.
    if name in _API:
        from budgeted_attention import api  # noqa: PLC0415 - torch and the models load on first use

        return getattr(api, name)
    raise AttributeError(f"module 'budgeted_attention' has no attribute {name!r}")


__all__ = [
    "BAAError",
    "BudgetError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "validate_budget",
    "__version__",
    *_API,
]
