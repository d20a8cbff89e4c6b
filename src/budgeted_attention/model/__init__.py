"""Model stage: attention with per-head gates, budget gates, FLOP cost model, encoder classifier."""

from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel, estimated_cost
from budgeted_attention.model.gates import BudgetGates
from budgeted_attention.model.transformer import EncoderClassifier

__all__ = ["BudgetGates", "CostModel", "EncoderClassifier", "ModelConfig", "estimated_cost"]
