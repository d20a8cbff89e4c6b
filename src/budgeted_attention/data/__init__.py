"""Data stage: data sets as tensors of token ids, masks and labels."""

from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits

__all__ = ["SyntheticConfig", "TensorSplits", "make_synthetic_splits"]
