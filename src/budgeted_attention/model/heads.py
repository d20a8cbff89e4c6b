"""The one head-subset attention every module tree and lean copy runs (encoder, decoder, BERT family, hf-decoder).

Weight layout (any run of adjacent heads is a contiguous, copy-free view):

* ``qkv_weight`` (H * 3 * hd, d): rows of stored head h are ``[q_h; k_h; v_h]``; ``qkv_bias`` likewise;
* ``out_weight_t`` (H * hd, d_out): the output projection stored transposed, head h's ``hd`` rows
  consecutive (a transposed view of a (d_out, H * hd) weight is fine: only rows are sliced).

A call runs the heads at ascending stored positions ``heads`` (a ``range`` for a prefix, a tuple for
a per-input router's set; None: every stored head): one run of adjacent heads from views of the
stored rows; a set with gaps from its rows gathered (with autograd a copy per call; without it,
cached per set while the weights are unchanged, or, once the cache is full, run by run of
adjacent heads from views: re-gathering a large model's sets on every call would copy more
weight memory than the removed heads saved).

After the projections every family runs :func:`attend_projected` (SDPA, per-head gates, the output
projection of the running heads): the layouts above through :func:`attend`, and the
``hf-decoder`` family (separate Q/K/V projections, rotary positions, a K/V cache and grouped-query
K/V heads, :mod:`budgeted_attention.hf.decoder`) after its own projections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from budgeted_attention.model.gates import LayerSelection
from budgeted_attention.model.gathered import GatherCache

# (qkv_weight, qkv_bias, out_weight_t) rows of some heads, in the layout above.
Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Norm = Callable[[torch.Tensor], torch.Tensor]


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Separate (H * hd, ...) query, key and value weights (or biases) in the per-head interleaved
    layout (H * 3 * hd, ...), copied once (differentiable)."""
    n, rest = q.shape[0] // head_dim, q.shape[1:]
    return torch.stack([t.reshape(n, head_dim, *rest) for t in (q, k, v)], dim=1).reshape(3 * n * head_dim, *rest)


def _runs(heads: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of adjacent positions in ascending ``heads``, as [start, stop) pairs."""
    runs, start = [], heads[0]
    for previous, head in zip(heads, heads[1:]):
        if head != previous + 1:
            runs.append((start, previous + 1))
            start = head
    runs.append((start, heads[-1] + 1))
    return runs


def _span(weights: Rows, hd: int, start: int, stop: int) -> Rows:
    qkv_weight, qkv_bias, out_weight_t = weights
    return qkv_weight[3 * start * hd : 3 * stop * hd], qkv_bias[3 * start * hd : 3 * stop * hd], out_weight_t[start * hd : stop * hd]


def _gather(weights: Rows, hd: int, heads: Sequence[int]) -> Rows:
    """The rows of the stored heads ``heads``, copied."""
    qkv_weight, qkv_bias, out_weight_t = weights
    n, d = len(heads), qkv_weight.shape[1]
    index = torch.tensor(heads, dtype=torch.long, device=qkv_weight.device)
    stored = qkv_weight.shape[0] // (3 * hd)
    return (
        qkv_weight.view(stored, 3 * hd, d).index_select(0, index).view(n * 3 * hd, d),
        qkv_bias.view(stored, 3 * hd).index_select(0, index).view(n * 3 * hd),
        out_weight_t.view(stored, hd, -1).index_select(0, index).view(n * hd, -1),
    )


def head_rows(weights: Rows, hd: int, heads: Sequence[int] | None, cache: GatherCache | None = None) -> list[Rows]:
    """The weight rows of the running heads, one entry per piece the call computes: the stored
    tensors themselves (every head), views (one run of adjacent heads), a gathered copy (a set
    with gaps), or one view per run (a set with gaps when ``cache`` has no room for it)."""
    stored = weights[0].shape[0] // (3 * hd)
    if heads is None or len(heads) == stored:  # every stored head: no slicing views on the dense path
        return [weights]
    first, n = heads[0], len(heads)
    if heads[-1] - first + 1 == n:
        return [_span(weights, hd, first, first + n)]
    if cache is None or torch.is_grad_enabled():  # training: the gathered copy carries the gradients
        return [_gather(weights, hd, heads)]
    key = tuple(heads)
    entry = cache.lookup(key, weights)
    if entry is None:
        if not cache.room_for(n * hd * (3 * weights[0].shape[1] + 3 + weights[2].shape[1]) * weights[0].element_size()):
            return [_span(weights, hd, a, b) for a, b in _runs(heads)]
        entry = _gather(weights, hd, heads)
        cache.put(key, weights, entry)
    return [entry]


def project(x: torch.Tensor, batch: int, seq: int, rows: list[Rows], hd: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of the heads in ``rows`` over (batch, seq, d) or (batch * seq, d)
    states: one ``F.linear`` per piece; each (batch, n, seq, hd)."""
    parts = [F.linear(x, qkv_weight, qkv_bias) for qkv_weight, qkv_bias, _ in rows]
    qkv = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    q, k, v = qkv.view(batch, seq, -1, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)
    return q, k, v


def combine(y: torch.Tensor, rows: list[Rows], out_bias: torch.Tensor | None, gates: torch.Tensor | None = None) -> torch.Tensor:
    """The output projection of per-head results ``y`` (batch, n, seq, hd), each head scaled by
    its gate (``gates``: (n,) or per input (batch, n)); (batch * seq, d_out), bias included (None:
    no bias). Only the ``out_weight_t`` of each piece of ``rows`` is read."""
    batch, n, seq, hd = y.shape
    if gates is not None:
        y = y * gates.to(y.dtype).view(-1, n, 1, 1)
    y = y.transpose(1, 2).reshape(batch * seq, n * hd)
    out, column = None, 0
    for _, _, out_weight_t in rows:  # columns of y in set order: piece after piece
        width = out_weight_t.shape[0]
        part = y if len(rows) == 1 else y[:, column : column + width]
        if out is not None:
            out = out.addmm_(part, out_weight_t)
        else:
            out = torch.mm(part, out_weight_t) if out_bias is None else torch.addmm(out_bias, part, out_weight_t)
        column += width
    return out


def attend_projected(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: list[Rows],
    out_bias: torch.Tensor | None,
    *,
    gates: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """The head-subset attention after the projections, shared by every family: SDPA over the
    running heads' queries (batch, n, seq, hd) and keys/values (batch, n, keys, hd) (a decoder
    passes them after rotary positions, its K/V cache and the GQA expansion), each head scaled by
    its gate, then the output projection of those heads' ``rows``; (batch * seq, d_out).

    ``mask``: None or boolean, broadcastable to (batch, n, seq, keys), True where a query may
    attend a key; ``causal``: each position attends to itself and earlier positions only (with a
    mask, both must allow it)."""
    seq = q.shape[2]
    is_causal = causal and mask is None
    if causal and mask is not None:  # keys must be both earlier (or the same position) and allowed
        mask = mask & torch.ones(seq, k.shape[2], dtype=torch.bool, device=q.device).tril()
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scale)
    return combine(y, rows, out_bias, gates)


def attend(
    x: torch.Tensor,
    batch: int,
    seq: int,
    weights: Rows,
    out_bias: torch.Tensor,
    hd: int,
    heads: Sequence[int] | None = None,
    *,
    gates: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    q_norm: Norm | None = None,
    k_norm: Norm | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
    cache: GatherCache | None = None,
) -> torch.Tensor:
    """Self-attention of the stored heads ``heads`` only over (batch, seq, d) or (batch * seq, d) states.

    Args:
        weights: (qkv_weight, qkv_bias, out_weight_t) of every stored head (module docstring).
        out_bias: (d_out,) output bias; a call running no head returns it alone, the constant
            fully-gated heads would give.
        heads: ascending stored positions (``range(n)``: a prefix); None runs every stored head.
        gates: per-head gates of the running heads, (n,) or per input (batch, n); None: ungated.
        mask: None or boolean (batch, 1, 1, seq), True where keys may be attended.
        causal: each position attends to itself and earlier positions only.
        q_norm, k_norm: applied to every head's queries / keys (batch, n, seq, hd) (QK-norm).
        scale: SDPA's score scale (None: 1 / sqrt(hd)); dropout: attention dropout probability.
        cache: gathered sets of this module's weights (inference only).

    Returns:
        (batch * seq, d_out), output bias included.
    """
    if heads is not None and len(heads) == 0:
        return out_bias.expand(batch * seq, out_bias.shape[0])
    rows = head_rows(weights, hd, heads, cache)
    q, k, v = project(x, batch, seq, rows, hd)
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    return attend_projected(q, k, v, rows, out_bias, gates=gates, mask=mask, causal=causal, scale=scale, dropout=dropout)


def attend_selection(
    x: torch.Tensor, weights: Rows, out_bias: torch.Tensor, hd: int, active: int, selection: LayerSelection,
    *, mask: torch.Tensor | None = None, **options,
) -> torch.Tensor:
    """A module tree's attention: the heads ``selection`` names among the first ``active`` stored
    heads (soft gates, a per-input selection or one head set), (batch, seq, d) -> (batch, seq, d_out).
    ``options``: those of :func:`attend`."""
    batch, seq, _ = x.shape
    if selection.chosen is not None:
        if selection.chosen.shape != (batch, active):
            raise ValueError(f"head selection must have shape ({batch}, {active}), got {tuple(selection.chosen.shape)}")
        out = attend_chosen(x, batch, seq, weights, out_bias, hd, selection.chosen, mask=mask, **options)
    else:
        heads = range(active) if selection.heads is None else selection.heads
        out = attend(x, batch, seq, weights, out_bias, hd, heads, gates=selection.gates, mask=mask, **options)
    return out.view(batch, seq, -1)


def attend_chosen(
    x: torch.Tensor, batch: int, seq: int, weights: Rows, out_bias: torch.Tensor, hd: int, chosen: torch.Tensor,
    *, mask: torch.Tensor | None = None, **options,
) -> torch.Tensor:
    """:func:`attend` with a head set per input: ``chosen`` (batch, n) boolean over the first n
    stored heads. Inputs sharing a set run together, each group its heads only; with more
    distinct sets than heads, head by head instead (head h on the inputs that chose it, from its
    own rows, its share of the output projection added to their rows): the same FLOPs in at most
    n calls. ``x`` and ``options``: as for :func:`attend`; (batch * seq, d_out)."""
    n = chosen.shape[1]
    if chosen.shape[0] != batch:
        raise ValueError(f"head selection must have shape ({batch}, {n}), got {tuple(chosen.shape)}")
    patterns, inverse = (chosen, None) if batch == 1 else torch.unique(chosen, dim=0, return_inverse=True)
    if patterns.shape[0] == 1:  # one set for the whole batch (the serving case: no grouping work)
        return attend(x, batch, seq, weights, out_bias, hd, _positions(patterns[0]), mask=mask, **options)
    x3 = x.view(batch, seq, -1)
    d_out = out_bias.shape[0]

    def run(rows: torch.Tensor, heads: Sequence[int], bias: torch.Tensor) -> torch.Tensor:
        part_mask = None if mask is None else mask.index_select(0, rows)
        return attend(x3.index_select(0, rows), len(rows), seq, weights, bias, hd, heads, mask=part_mask, **options).view(-1, seq, d_out)

    if patterns.shape[0] <= n:
        out = x.new_empty(batch, seq, d_out)
        for group, pattern in enumerate(patterns):
            rows = (inverse == group).nonzero().flatten()
            out[rows] = run(rows, _positions(pattern), out_bias)
        return out.view(batch * seq, d_out)
    out = out_bias.expand(batch, seq, d_out).clone()
    no_bias = torch.zeros_like(out_bias)
    for head, column in enumerate(chosen.t().tolist()):
        rows = [i for i, on in enumerate(column) if on]
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=x.device)
            out.index_add_(0, index, run(index, range(head, head + 1), no_bias))
    return out.view(batch * seq, d_out)


def _positions(pattern: torch.Tensor) -> tuple[int, ...]:
    """The positions a (n,) boolean pattern selects, ascending."""
    return tuple(i for i, on in enumerate(pattern.tolist()) if on)
