"""Pretrained Hugging Face encoders with budget gates (BERT family: BERT, BERT-Mini/Tiny, MiniLM).

transformers 5 removed ``prune_heads`` and ``head_mask``, so this package installs its own
self-attention module (SDPA, per-head gates, physically removable heads) into a loaded
``BertForSequenceClassification``.
"""

from budgeted_attention.hf.bert import GatedBertClassifier, load_gated_bert, minilm_path

__all__ = ["GatedBertClassifier", "load_gated_bert", "minilm_path"]
