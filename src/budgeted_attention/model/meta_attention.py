"""Meta-Attention: each token routed among three causal attention experts by a controller.

Experts (all causal; keys at padding are never attended):

* ``full``: softmax attention over every earlier key (and itself);
* ``linear``: kernel attention with feature map phi(x) = elu(x) + 1, read from prefix sums
  S_t = sum_{s <= t} phi(k_s) v_s^T and z_t = sum_{s <= t} phi(k_s);
* ``window``: softmax attention over the last ``window`` keys (itself included).

Controllers (``MetaConfig.controller``):

* ``bayesian``: a Dirichlet posterior per token, concentration beta_hat = beta + softplus(MLP([x,
  ||x|| / sqrt(D), position])), under the compute-aware prior beta_i = eps + beta0 (1 - c_i);
  routing weights are reparameterised Dirichlet samples in training and the posterior mean at
  evaluation; the training loss adds ``kl_weight`` x the mean KL(Dir(beta_hat) || Dir(beta)).
* ``prior-free``: the same with no KL term (the paper's ablation, w = 0);
* ``softmax``: a deterministic router, weights = softmax(MLP(...)), no sampling, no KL.

Routing modes (``MetaSelfAttention.routing``): ``soft`` mixes the three experts' outputs with the
weights (every expert runs on every token); ``hard`` (evaluation only) sends each token to the
argmax expert and computes that expert for that token only: a full-attention query attends to its
earlier keys, a linear token reads its prefix state, a window token its window, so the attention
FLOPs really drop. ``flops`` counts what the hard path computed (attention core only: the shared
Q/K/V and output projections are the same for every expert).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.attention import GatedSelfAttention
from budgeted_attention.model.config import EXPERTS, MetaConfig
from budgeted_attention.model.gates import DENSE, LayerSelection
from budgeted_attention.model.heads import combine, head_rows, project


def elu_feature(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, the linear-attention feature map."""
    return F.elu(x) + 1.0


# Chunk length of the hard path's linear attention (see MetaSelfAttention._linear_rows).
LINEAR_CHUNK = 64


def linear_attention_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal kernel attention for every position, in its parallel (masked quadratic) form.

    phi(q_t) S_t / (phi(q_t) . z_t) with S_t = sum_{s <= t} phi(k_s) v_s^T equals
    sum_{s <= t} a_ts v_s / sum_{s <= t} a_ts with a_ts = phi(q_t) . phi(k_s): two matmuls
    instead of a (T, hd, hd) prefix-state tensor, the fast form for training on every token
    (the hard path reads chunked prefix states for the tokens routed here).

    Args:
        q, k, v: (B, n, T, hd).
        key_mask: optional (B, T) bool, True for real tokens (padded keys contribute nothing).

    Returns:
        (B, n, T, hd).
    """
    seq = q.shape[2]
    scores = elu_feature(q) @ elu_feature(k).transpose(-1, -2)  # (B, n, T, T), all > 0
    keep = causal_mask(seq, device=q.device)
    if key_mask is not None:
        keep = keep.unsqueeze(0) & key_mask.view(key_mask.shape[0], 1, -1)
        keep = keep.unsqueeze(1)
    scores = scores * keep.to(scores.dtype)
    return (scores @ v) / scores.sum(-1, keepdim=True).clamp_min(1e-6)


def causal_mask(seq: int, window: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """(T, T) bool, True where query t may attend key s: s <= t (and t - s < window when window > 0)."""
    t = torch.arange(seq, device=device)
    offset = t.view(-1, 1) - t.view(1, -1)
    allowed = offset >= 0
    return allowed & (offset < window) if window > 0 else allowed


def _with_keys(mask: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """(T, T) mask combined with (B, T) real keys -> (B, 1, T, T) (or (T, T) without padding).

    A query row left with no key (a padded query before any real token) keeps its own position,
    so softmax stays finite; its output is never read.
    """
    if key_mask is None:
        return mask
    combined = mask.unsqueeze(0) & key_mask.view(key_mask.shape[0], 1, -1)
    eye = torch.eye(mask.shape[0], dtype=torch.bool, device=mask.device).unsqueeze(0)
    combined = combined | (eye & ~combined.any(-1, keepdim=True))
    return combined.unsqueeze(1)


class MetaController(nn.Module):
    """Per-token routing weights over :data:`EXPERTS` from [x, ||x||/sqrt(D), position]."""

    def __init__(self, d_model: int, cfg: MetaConfig, max_len: int) -> None:
        super().__init__()
        self.cfg, self.d_model, self.max_len = cfg, d_model, max_len
        self.mlp = nn.Sequential(nn.Linear(d_model + 2, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, len(EXPERTS)))
        nn.init.zeros_(self.mlp[2].weight)  # start at the prior (bayesian) or uniform (softmax)
        nn.init.zeros_(self.mlp[2].bias)
        self.register_buffer("prior", torch.tensor(cfg.prior_concentration(), dtype=torch.float32), persistent=False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D + 2): the hidden state, its RMS-scaled norm and position / (max_len - 1)."""
        batch, seq, dim = x.shape
        norm = x.norm(dim=-1, keepdim=True) / math.sqrt(dim)
        position = (torch.arange(seq, device=x.device, dtype=x.dtype) / max(1, self.max_len - 1)).view(1, seq, 1).expand(batch, seq, 1)
        return torch.cat([x, norm, position], dim=-1)

    def concentration(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, 3) posterior concentration beta_hat = beta + softplus(MLP) (Dirichlet controllers)."""
        return self.prior + F.softplus(self.mlp(self.features(x)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(routing weights (B, T, 3) summing to 1, concentration or None for ``softmax``)."""
        if self.cfg.controller == "softmax":
            return torch.softmax(self.mlp(self.features(x)), dim=-1), None
        beta_hat = self.concentration(x)
        if self.training:
            weights = torch.distributions.Dirichlet(beta_hat).rsample()
        else:
            weights = beta_hat / beta_hat.sum(-1, keepdim=True)
        return weights, beta_hat

    def kl(self, beta_hat: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
        """Mean over real tokens of KL(Dir(beta_hat) || Dir(prior))."""
        prior = torch.distributions.Dirichlet(self.prior.expand_as(beta_hat))
        per_token = torch.distributions.kl_divergence(torch.distributions.Dirichlet(beta_hat), prior)
        if token_mask is None:
            return per_token.mean()
        weights = token_mask.to(per_token.dtype)
        return (per_token * weights).sum() / weights.sum().clamp_min(1.0)


class MetaSelfAttention(GatedSelfAttention):
    """Causal self-attention whose mechanism is chosen per token (see the module docstring).

    The Q/K/V and output projections, head gates, head surgery and prefix slicing are those of
    :class:`GatedSelfAttention`; all heads of a token use the token's expert.

    Attributes:
        routing: ``soft`` or ``hard`` (hard only in eval mode).
        pending_kl: KL terms of training forward passes not yet added to a loss.
        record: when True, every forward appends (weights (B, T, 3), key mask or None) to ``records``.
        flops: attention-core FLOPs per expert accumulated by hard forward passes.
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int, dropout: float, cfg: MetaConfig, max_len: int, *, qk_norm: bool = False) -> None:
        super().__init__(d_model, n_heads, head_dim, dropout, causal=True, qk_norm=qk_norm)
        self.cfg = cfg
        self.controller = MetaController(d_model, cfg, max_len)
        self.routing = "soft"
        self.pending_kl: list[torch.Tensor] = []
        self.record = False
        self.records: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.flops = dict.fromkeys(EXPERTS, 0)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, selection: LayerSelection = DENSE) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model); ``attn_mask``: None or (B, 1, 1, T) bool, True at real
        keys; ``selection``: soft gates of the active heads (Meta-Attention runs a prefix of heads)."""
        n = self.active_heads
        batch, seq, _ = x.shape
        if n == 0:
            return self.out_bias.expand(batch, seq, self.d_model)
        rows = head_rows(self.weights(), self.head_dim, range(n))
        q, k, v = project(x, batch, seq, rows, self.head_dim)  # (B, n, T, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        key_mask = None if attn_mask is None else attn_mask.view(batch, seq)
        weights, beta_hat = self.controller(x)
        if self.training and beta_hat is not None and self.cfg.kl_weight > 0:
            self.pending_kl.append(self.controller.kl(beta_hat, key_mask))
        if self.record:
            self.records.append((weights.detach(), None if key_mask is None else key_mask.detach()))
        if self.routing == "hard" and not self.training:
            y = self.hard(q, k, v, weights.argmax(dim=-1), key_mask)
        else:
            y = self.soft(q, k, v, weights, key_mask)
        return combine(y, rows, self.out_bias, selection.gates).view(batch, seq, self.d_model)

    def experts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> list[torch.Tensor]:
        """Every expert's output at every position: three (B, n, T, hd) tensors."""
        seq = q.shape[2]
        drop = self.dropout if self.training else 0.0
        if key_mask is None:
            full = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
            full = F.scaled_dot_product_attention(q, k, v, attn_mask=_with_keys(causal_mask(seq, device=q.device), key_mask), dropout_p=drop)
        window = F.scaled_dot_product_attention(
            q, k, v, attn_mask=_with_keys(causal_mask(seq, self.cfg.window, q.device), key_mask), dropout_p=drop
        )
        return [full, linear_attention_causal(q, k, v, key_mask), window]

    def soft(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weights: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Weighted mixture of the experts; ``weights`` (B, T, 3)."""
        outputs = self.experts(q, k, v, key_mask)
        return sum(weights[..., i].unsqueeze(1).unsqueeze(-1) * out for i, out in enumerate(outputs))

    @torch.no_grad()
    def hard(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, choice: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """Each token's chosen expert only; ``choice`` (B, T) expert index. Rows are routed one
        by one (each has its own token sets); the FLOPs computed are added to :attr:`flops`."""
        y = torch.zeros_like(q)
        for row in range(q.shape[0]):
            real = None if key_mask is None else key_mask[row]
            y[row] = self._hard_row(q[row], k[row], v[row], choice[row], real)
        return y

    def _hard_row(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, choice: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
        """One sequence: q, k, v (n, T, hd), choice (T,), real (T,) bool or None -> (n, T, hd)."""
        n, seq, hd = q.shape
        out = torch.zeros_like(q)
        positions = torch.arange(seq, device=q.device)
        full_idx, linear_idx, window_idx = (torch.nonzero(choice == i).flatten() for i in range(len(EXPERTS)))
        if len(full_idx):
            # Only the keys up to the last full-attention query are ever needed.
            last = int(full_idx[-1]) + 1
            allowed = positions[:last].view(1, -1) <= full_idx.view(-1, 1)
            if real is not None:
                allowed = allowed & real[:last].view(1, -1)
                # A query with no real key keeps its own position, as in soft mode (never read).
                empty = ~allowed.any(-1)
                allowed[empty, full_idx[empty]] = True
            out[:, full_idx] = F.scaled_dot_product_attention(q[:, full_idx], k[:, :last], v[:, :last], attn_mask=allowed)
            # Charged the whole rectangle a masked kernel computes (not only the causal keys).
            self.flops["full"] += 4 * n * hd * len(full_idx) * last
        if len(linear_idx):
            out[:, linear_idx] = self._linear_rows(q, k, v, linear_idx, real)
        if len(window_idx):
            w = self.cfg.window
            offsets = torch.arange(-w + 1, 1, device=q.device)
            keys = window_idx.view(-1, 1) + offsets.view(1, -1)  # (W, w) key positions, < 0 outside
            valid = keys >= 0
            if real is not None:
                valid = valid & real[keys.clamp_min(0)]
                valid[:, -1] |= ~valid.any(-1)
            gathered_k, gathered_v = k[:, keys.clamp_min(0)], v[:, keys.clamp_min(0)]  # (n, W, w, hd)
            scores = torch.einsum("nqd,nqwd->nqw", q[:, window_idx], gathered_k) / math.sqrt(hd)
            scores = scores.masked_fill(~valid.unsqueeze(0), float("-inf"))
            out[:, window_idx] = torch.einsum("nqw,nqwd->nqd", torch.softmax(scores, dim=-1), gathered_v)
            self.flops["window"] += 4 * n * hd * len(window_idx) * w
        return out

    def _linear_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
        """Causal kernel attention of the query positions ``rows`` (1-D, increasing), chunked.

        Keys are cut into chunks of ``C`` = :data:`LINEAR_CHUNK` positions. A query in chunk c reads
        the prefix state of the chunks before it, S_c = sum_{s < cC} phi(k_s) v_s^T (one (hd, hd)
        matrix per chunk: T / C states, not T), plus the keys of its own chunk up to itself
        (a masked C x C block). The routed queries are scattered into the slots of the chunks that
        hold them (other chunks are not read), so the work is two batched matmuls per used chunk
        instead of a (T, hd, hd) prefix tensor, which is what made the per-token prefix form
        slower than full attention at 8k tokens.

        Args:
            q, k, v: (n, T, hd); rows: (L,) positions routed here; real: (T,) bool or None.

        Returns:
            (n, L, hd).
        """
        n, _, hd = q.shape
        last = int(rows[-1]) + 1
        chunk = min(LINEAR_CHUNK, last)  # a short sequence is one chunk: no padding
        chunks = -(-last // chunk)
        span = chunks * chunk
        phi_k = elu_feature(k[:, :last])
        if real is not None:
            phi_k = phi_k * real[:last].view(1, -1, 1).to(phi_k.dtype)
        values = v[:, :last]
        if span > last:  # pad the last chunk with zero keys (they add nothing)
            phi_k = F.pad(phi_k, (0, 0, 0, span - last))
            values = F.pad(values, (0, 0, 0, span - last))
        phi_k = phi_k.view(n, chunks, chunk, hd)
        values = values.view(n, chunks, chunk, hd)
        chunk_states = phi_k.transpose(-1, -2) @ values  # (n, chunks, hd, hd)
        chunk_norms = phi_k.sum(2)  # (n, chunks, hd)
        # Exclusive prefix over chunks (the chunks before c), built without a subtraction.
        states = torch.cat([torch.zeros_like(chunk_states[:, :1]), torch.cumsum(chunk_states[:, :-1], dim=1)], dim=1)
        norms = torch.cat([torch.zeros_like(chunk_norms[:, :1]), torch.cumsum(chunk_norms[:, :-1], dim=1)], dim=1)
        # Only the chunks holding routed queries are read; the routed queries go into their slots
        # (zeros elsewhere: those rows are never read).
        used, slot_chunk = torch.unique(rows // chunk, return_inverse=True)
        phi_q = q.new_zeros(n, len(used) * chunk, hd)
        slots = slot_chunk * chunk + rows % chunk
        phi_q[:, slots] = elu_feature(q[:, rows])
        phi_q = phi_q.view(n, len(used), chunk, hd)
        own_k, own_v = phi_k[:, used], values[:, used]
        local = (phi_q @ own_k.transpose(-1, -2)) * causal_mask(chunk, device=q.device).to(q.dtype)  # (n, U, C, C)
        numerator = phi_q @ states[:, used] + local @ own_v  # (n, U, C, hd)
        denominator = (phi_q @ norms[:, used].unsqueeze(-1)).squeeze(-1) + local.sum(-1)  # (n, U, C)
        y = (numerator / denominator.clamp_min(1e-6).unsqueeze(-1)).view(n, len(used) * chunk, hd)
        # chunk states: 2 hd^2 per key; per slot of a used chunk: state read 2 hd^2, own chunk 4 C hd
        self.flops["linear"] += n * (span * 2 * hd * hd + len(used) * chunk * (2 * hd * hd + 4 * chunk * hd))
        return y[:, slots]

    def reset_flops(self) -> None:
        self.flops = dict.fromkeys(EXPERTS, 0)

    def take_kl(self) -> torch.Tensor | None:
        """Mean of the pending KL terms (then cleared), or None."""
        if not self.pending_kl:
            return None
        kl = torch.stack(self.pending_kl).mean()
        self.pending_kl = []
        return kl
