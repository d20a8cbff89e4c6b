"""budgeted_attention: one transformer checkpoint, many cost/accuracy operating points.

A caller asks for an attention budget ``b`` in (0, 1]; budget-conditioned gates
switch attention heads off to fit it, and the pruning package turns the budget
into a physically smaller model that runs faster on a CPU.

Data flow (one subpackage per stage)::

    data -> model (attention, gates, cost) -> training -> pruning -> benchmark -> reporting
"""

from budgeted_attention.budget import validate_budget
from budgeted_attention.errors import BAAError, CheckpointError, ConfigError, DataError

__version__ = "0.1.0"

__all__ = [
    "BAAError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "validate_budget",
    "__version__",
]
