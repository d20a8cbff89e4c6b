"""Training stage: dense warm-start, budgeted training, hard-gate adaptation, evaluation."""

from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.evaluate import evaluate_accuracy
from budgeted_attention.training.stages import train_budgeted, train_dense, train_hard

__all__ = ["TrainConfig", "evaluate_accuracy", "train_budgeted", "train_dense", "train_hard"]
