"""What every family's lean executor shares (see :meth:`GatedModel.inference_module`).

Each family has two forward paths: its module tree (training, soft gates) and one lean executor
(inference: hard selections, slices, routed head sets), which runs the model's current layout as
one flat loop of kernels, without the module tree, gate code or per-call checks. A family's
executor (:class:`~budgeted_attention.model.compact.CompactEncoder` and
:class:`~budgeted_attention.model.compact.CompactDecoder` of our block stacks, the BERT family's
:class:`~budgeted_attention.hf.compact.CompactBert`) lays out its layers and writes the loop.
This base holds the rest: weights as unsaved buffers, prefix switching of heads and FFN neurons,
refusing what the executor does not run, and knowing when the copy is out of date.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from budgeted_attention.errors import BAAError
from budgeted_attention.model.gathered import GatherCache
from budgeted_attention.model.heads import attend


def keep(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """A weight as a buffer (``.to()`` moves it), never saved: the model's weights are saved with
    the model, so these stay out of every state dict."""
    module.register_buffer(name, tensor, persistent=False)


class LeanLayer(nn.Module):
    """One layer of a lean copy: ``stored_heads`` / ``stored_width`` present, the first ``n_heads``
    heads and ``ffn_width`` FFN neurons run (prefix views of the stored weights). Attention
    weights: ``qkv_weight`` (rows of head h are ``[q_h; k_h; v_h]``), ``qkv_bias``,
    ``out_weight_t`` (transposed), ``out_bias``, stored by the family's layer; ``attend_options``:
    the keyword options of :func:`~budgeted_attention.model.heads.attend` the family's attention
    runs with (causal, QK-norm, score scale)."""

    stored_heads: int
    n_heads: int
    head_dim: int
    stored_width: int
    ffn_width: int

    def __init__(self) -> None:
        super().__init__()
        self._gathered = GatherCache()  # per-input head sets' weights (a routed model's copy)
        self.attend_options: dict = {}

    def keep_ffn(self, fc1: nn.Linear, fc2: nn.Linear, norm: nn.LayerNorm, active_width: int) -> None:
        """Store an FFN (``fc2``'s weight transposed, a copy: a prefix of neurons is then a
        contiguous view) and its LayerNorm; the first ``active_width`` neurons run."""
        self.stored_width, self.ffn_width = fc1.out_features, active_width
        keep(self, "fc1_weight", fc1.weight.detach())
        keep(self, "fc1_bias", fc1.bias.detach())
        keep(self, "fc2_weight_t", fc2.weight.detach().t().contiguous())  # (stored_width, d)
        keep(self, "fc2_bias", fc2.bias.detach())
        keep(self, "ln_ffn_weight", norm.weight.detach())
        keep(self, "ln_ffn_bias", norm.bias.detach())
        self.ln_ffn_eps = norm.eps

    def running_heads(self, heads: tuple[int, ...] | None) -> int:
        """How many heads a call runs: ``len(heads)`` for a head set, else the active prefix."""
        return self.n_heads if heads is None else len(heads)

    def attend(self, h: torch.Tensor, batch: int, seq: int, mask: torch.Tensor | None, heads: tuple[int, ...] | None = None) -> torch.Tensor:
        """Self-attention of the running heads (at least one) over (batch * seq, d) states through
        :func:`~budgeted_attention.model.heads.attend`; (batch * seq, d). ``heads``: None runs the
        active prefix; a head set (ascending stored positions, a per-input router's choice for one
        input) runs those heads only."""
        weights = self.qkv_weight, self.qkv_bias, self.out_weight_t
        running = range(self.n_heads) if heads is None else heads
        return attend(h, batch, seq, weights, self.out_bias, self.head_dim, running, mask=mask, cache=self._gathered, **self.attend_options)

    def feed_forward(self, h: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The running FFN neurons (ffn_width > 0) over (batch * seq, d) states, second bias
        included; (batch * seq, d)."""
        width = self.ffn_width
        fc1_weight, fc1_bias, fc2_weight_t = self.fc1_weight, self.fc1_bias, self.fc2_weight_t
        if width != self.stored_width:  # a prefix of neurons: contiguous views
            fc1_weight, fc1_bias, fc2_weight_t = fc1_weight[:width], fc1_bias[:width], fc2_weight_t[:width]
        return torch.addmm(self.fc2_bias, activation(torch.addmm(fc1_bias, h, fc1_weight.t())), fc2_weight_t)

    def set_active(self, heads: int, ffn_width: int) -> None:
        """Run the first ``heads`` stored heads and ``ffn_width`` stored FFN neurons."""
        if not (0 <= heads <= self.stored_heads and 0 <= ffn_width <= self.stored_width):
            raise ValueError(
                f"active heads {heads} / FFN neurons {ffn_width} outside the stored {self.stored_heads} / {self.stored_width}"
            )
        self.n_heads, self.ffn_width = heads, ffn_width


class LeanCopy(nn.Module):
    """Base of the families' lean copies: ``self.layers`` (:class:`LeanLayer`) and the record of
    the model they were made from (:meth:`track`)."""

    layers: nn.ModuleList

    @staticmethod
    def refuse_unsupported(model: nn.Module, *, routed: bool = False) -> None:
        """Raise :class:`~budgeted_attention.errors.BAAError` naming the family and the feature
        when ``model`` has something its family's lean executor does not run
        (:meth:`GatedModel.lean_unsupported`)."""
        feature = model.lean_unsupported(routed=routed)
        if feature is not None:
            raise BAAError(f"the {model.family} family's lean executor does not run {feature}")

    def track(self, model: nn.Module) -> None:
        """Remember what :meth:`is_current` compares: ``model``'s surgery count and, for each of
        its parameters, the slot holding it (a replaced parameter is seen by identity), its
        storage (moved or converted: ``.to()``) and its in-place version (optimiser steps,
        ``load_state_dict``). A plain list, not registered: the parameters are the model's."""
        self._layout_version = model.layout_version
        self._slots = [
            (module._parameters, name, p) for module in model.modules() for name, p in module._parameters.items() if p is not None
        ]
        self._stamp = self._read_stamp()

    def _read_stamp(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.data_ptr(), p._version) for _, _, p in self._slots)

    def is_current(self, model: nn.Module) -> bool:
        """True while ``model`` (the one copied) has had no surgery, no parameter replaced, moved,
        converted or written in place since; about 10-20 µs. (Parameters added later, e.g. a
        router, are not seen: callers check for those themselves. Nor are writes that bump no
        version: edits through ``param.data``, and a fused optimiser's step unless the caller
        bumps the versions with ``torch.autograd.graph.increment_version``, as our trainer does.)"""
        return (
            model.layout_version == self._layout_version
            and all(slots.get(name) is p for slots, name, p in self._slots)
            and self._read_stamp() == self._stamp
        )

    def check_inference(self) -> None:
        """A lean copy has no dropout, and its weights are detached from the model's: in training
        mode it would silently do neither, so it refuses."""
        if self.training:
            raise RuntimeError(f"{type(self).__name__} is an inference copy (no dropout, no gradients to the model): call .eval()")

    def set_active(self, heads: list[int], ffn_widths: list[int] | None = None) -> None:
        """Run a prefix of each layer's stored heads and FFN neurons (``ffn_widths`` None: the
        widths stay as they are, as :meth:`GatedModel.set_active` does with group counts): views,
        no copies."""
        if len(heads) != len(self.layers) or (ffn_widths is not None and len(ffn_widths) != len(self.layers)):
            raise ValueError(f"need one head count (and FFN width) per layer ({len(self.layers)}), got {heads} / {ffn_widths}")
        for index, layer in enumerate(self.layers):
            layer.set_active(heads[index], layer.ffn_width if ffn_widths is None else ffn_widths[index])


class LeanFollower:
    """A model's lean copy (:meth:`GatedModel.inference_module`), kept in step with the model, for
    the runtimes that serve through one (:class:`~budgeted_attention.pruning.switching.SlicedModel`,
    :class:`~budgeted_attention.model.routed_inference.RoutedInference`).

    :meth:`current` hands out the copy only while the model is in eval mode and autograd is off;
    a copy the model has outgrown (surgery, training steps, ``load_state_dict``, a replaced, moved
    or converted parameter) is rebuilt first, or dropped when the model no longer has one; and its
    active heads and FFN neurons follow the model's, however they were set. A plain object, not a
    module: ``train()`` / ``to()`` on the runtime reach the model only, and the copy (always in
    eval mode) is rebuilt from it when they changed it. Not seen: edits through ``param.data``
    (their own version counter); build a new runtime after one.

    ``unsupported``: what the model has that its family's executor does not run
    (:meth:`GatedModel.lean_unsupported`; None while it has one): the runtime then serves
    through the module tree, by the model's own account, never by a failed build.
    """

    def __init__(self, model: nn.Module, *, routed: bool = False) -> None:
        self.model, self.routed = model, routed
        self.copy = self._build()
        self._counts = self._active_counts()

    def _build(self) -> nn.Module | None:
        """The model's lean executor; None where the model has something the executor does not
        run (:meth:`GatedModel.lean_unsupported`, kept in :attr:`unsupported`): the module tree serves."""
        self.unsupported = self.model.lean_unsupported(routed=self.routed)
        if self.unsupported is not None:
            return None
        # Outside inference mode, so the copy's own tensors (CompactBert's fused Q/K/V) have
        # versions and their gathered head sets can be cached, wherever the rebuild happens.
        with torch.inference_mode(False):
            return self.model.inference_module(routed=self.routed).eval()

    def _active_counts(self) -> tuple[list[int], list[int] | None]:
        """(heads per layer, FFN neurons per layer or None) the model runs now."""
        return self.model.active_heads(), self.model.active_ffn_widths()

    def current(self) -> nn.Module | None:
        """The copy, in step with the model, when it may serve now; None when the module tree runs.
        Microseconds: the staleness check reads every parameter's slot, storage and version."""
        if self.copy is None or self.model.training or torch.is_grad_enabled():
            return None
        counts = self._active_counts()
        if not self.copy.is_current(self.model):
            self.copy = self._build()
            if self.copy is None:
                return None
            self._counts = counts  # a new copy runs the model's active prefixes
        if counts != self._counts:
            self.copy.set_active(*counts)
            self._counts = counts
        return self.copy


def unsupported_by_any(model: nn.Module, *, routed: bool = False) -> str | None:
    """What no family's lean executor runs, as the phrase :meth:`GatedModel.lean_unsupported`
    returns (None: nothing): a per-input router's decision unless ``routed`` (the executor then
    runs the head sets it is given), and parameters that are inference tensors (made under
    ``torch.inference_mode()``: no version counter, so the copy could not know it is out of date)."""
    if model.router is not None and not routed:
        return "a per-input router's decision (RoutedInference runs it: the router decides, the executor computes)"
    if any(p.is_inference() for p in model.parameters()):
        return "parameters that are inference tensors (made under torch.inference_mode: no version to track)"
    return None


def key_mask(attention_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """SDPA's boolean (batch, 1, 1, seq) key mask of a (batch, seq) 0/1 ``attention_mask``; None
    when every token is real (SDPA then runs its unmasked kernel, as transformers does). While
    compiling or capturing a CUDA graph the check (a host sync) is skipped and the mask always
    built, as transformers does."""
    if attention_mask is None:
        return None
    skip_check = torch.compiler.is_compiling() or (attention_mask.is_cuda and torch.cuda.is_current_stream_capturing())
    if not skip_check and bool(attention_mask.all()):
        return None
    return attention_mask.to(device=device, dtype=torch.bool).reshape(attention_mask.shape[0], 1, 1, -1)
