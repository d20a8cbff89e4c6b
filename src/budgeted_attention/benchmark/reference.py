"""A plain dense encoder with no gate code, used as the latency reference.

It is the textbook pre-LN encoder (separate Q/K/V linear layers, SDPA, output linear) built
from an :class:`EncoderClassifier`'s weights, so "gating costs nothing at b = 1" can be
measured against a model that has never heard of gates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.transformer import EncoderClassifier


class PlainAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.q = nn.Linear(d_model, n_heads * head_dim)
        self.k = nn.Linear(d_model, n_heads * head_dim)
        self.v = nn.Linear(d_model, n_heads * head_dim)
        self.out = nn.Linear(n_heads * head_dim, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class PlainBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, head_dim: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = PlainAttention(d_model, n_heads, head_dim)
        self.d_ff = d_ff
        if d_ff:
            self.ln2 = nn.LayerNorm(d_model)
            self.fc1 = nn.Linear(d_model, d_ff)
            self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        if self.d_ff:
            x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x


class PlainEncoder(nn.Module):
    """Dense encoder classifier without gates; logits equal ``EncoderClassifier(ids)``."""

    def __init__(self, source: EncoderClassifier) -> None:
        super().__init__()
        cfg = source.config
        if cfg.is_pruned:
            raise ValueError("PlainEncoder mirrors the unpruned model only")
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(PlainBlock(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff) for _ in range(cfg.n_layers))
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.classifier = nn.Linear(cfg.d_model, cfg.n_classes)
        self._copy_from(source)
        self.eval()

    @torch.no_grad()
    def _copy_from(self, source: EncoderClassifier) -> None:
        cfg = source.config
        self.token_embedding.load_state_dict(source.token_embedding.state_dict())
        self.position_embedding.load_state_dict(source.position_embedding.state_dict())
        self.ln_final.load_state_dict(source.ln_final.state_dict())
        self.classifier.load_state_dict(source.classifier.state_dict())
        h, hd, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        for plain, block in zip(self.blocks, source.blocks):
            plain.ln1.load_state_dict(block.ln_attn.state_dict())
            qkv_w = block.attn.qkv_weight.view(h, 3, hd, d)
            qkv_b = block.attn.qkv_bias.view(h, 3, hd)
            for index, linear in enumerate((plain.attn.q, plain.attn.k, plain.attn.v)):
                linear.weight.copy_(qkv_w[:, index].reshape(h * hd, d))
                linear.bias.copy_(qkv_b[:, index].reshape(h * hd))
            plain.attn.out.weight.copy_(block.attn.out_weight_t.t())
            plain.attn.out.bias.copy_(block.attn.out_bias)
            if cfg.d_ff:
                plain.ln2.load_state_dict(block.ln_ffn.state_dict())
                plain.fc1.load_state_dict(block.ffn.fc1.state_dict())
                plain.fc2.load_state_dict(block.ffn.fc2.state_dict())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        x = self.ln_final(x)
        return self.classifier(x[:, 0])
