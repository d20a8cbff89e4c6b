"""The one interface every model family implements (our encoder, the BERT family, and later
decoders, attention-only and routed models).

Bench, save/load, pruning, instant switching and the experiment pipeline are written once
against :class:`GatedModel`. A family implements the few methods marked "family" below; the
gate bookkeeping shared by all of them lives here.

Head identity. Gates are defined on the *full* (n_layers, n_heads) grid of the unpruned model.
A pruned or re-ordered model records, per layer, which original head each of its physical heads
is (``head_ids``). Every forward pass re-indexes the full-grid gates to the physical heads, so
``model(ids, budget=b)`` on a pruned or sorted model means exactly what it means on the full
model restricted to the heads it still has.

Feed-forward groups (``budget_scope: all``). A model built with ``ffn_group_size`` > 0 also has
``ffn_gates`` over a (n_layers, n_groups) grid of FFN neuron groups (``group_size`` consecutive
neurons of the first FFN layer, after the neurons were sorted by importance). Groups follow the
same rules as heads: ``group_ids`` names the original group of each physical group, surgery
removes groups, prefix slicing serves nested budgets.
"""

from __future__ import annotations

import copy
from abc import ABCMeta, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from budgeted_attention.budget import validate_budget
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.gates import DENSE, BudgetGates, LayerSelection, UnitGates, identity_head_ids, validate_head_ids
from budgeted_attention.model.router import HeadRouter, RouterConfig, pooled_embeddings


class GatedModel(nn.Module, metaclass=ABCMeta):
    """Base class of gated classifiers: budget gates over a (layer, head) grid, prunable heads.

    Family subclasses set ``family`` and implement ``forward`` (with :meth:`layer_selections`),
    ``_physical_keep`` (remove heads), ``_set_active`` (prefix slicing), ``cost_model``,
    ``lean_unsupported``, ``inference_module`` (the lean executor), ``describe`` and ``from_description``.

    Attributes:
        gates: :class:`BudgetGates` of shape (n_layers, n_heads), the full grid.
        n_layers, n_heads: the full grid.
        head_ids: per layer, the original head index of each physical head, in storage order.
    """

    family: ClassVar[str] = ""
    # Families whose forward pass consults a per-input head router (:meth:`layer_selections`).
    supports_routing: ClassVar[bool] = False

    def _init_heads(
        self,
        n_layers: int,
        n_heads: int,
        head_ids: list[list[int]] | None = None,
        *,
        ffn_width: int = 0,
        group_size: int = 0,
        group_ids: list[list[int]] | None = None,
    ) -> None:
        """Set up the gate grids: heads always; FFN groups when ``group_size`` > 0.

        Args:
            ffn_width: neurons of one unpruned feed-forward block (d_ff); must be a multiple of
                ``group_size`` when groups are used.
        """
        self.n_layers, self.n_heads = n_layers, n_heads
        self.gates = BudgetGates(n_layers, n_heads)
        self.head_ids = validate_head_ids(head_ids, n_layers, n_heads) if head_ids else identity_head_ids(n_layers, n_heads)
        self._active = [len(h) for h in self.head_ids]
        # Counts the surgeries (keep_units, sort_ffn_neurons): copies made from the weights
        # (lean inference copies) compare it to know they are out of date.
        self.layout_version = 0
        # Per layer, the full-grid index of each active head and FFN group (None: the identity).
        self._gate_index: tuple[list[torch.Tensor] | None, list[torch.Tensor] | None] | None = None
        self._position_of: list[dict[int, int]] | None = None  # per layer, head id -> physical position
        self.group_size = int(group_size)
        self.n_groups = 0
        self.ffn_gates: BudgetGates | None = None
        self.group_ids: list[list[int]] = []
        if self.group_size > 0:
            if ffn_width <= 0 or ffn_width % self.group_size:
                raise ValueError(f"ffn_group_size ({group_size}) must divide the feed-forward width ({ffn_width})")
            self.n_groups = ffn_width // self.group_size
            self.ffn_gates = BudgetGates(n_layers, self.n_groups)
            self.group_ids = (
                validate_head_ids(group_ids, n_layers, self.n_groups) if group_ids else identity_head_ids(n_layers, self.n_groups)
            )
        self._active_groups = [len(g) for g in self.group_ids]
        self.router: HeadRouter | None = None

    # ------------------------------------------------------------------ shape

    @property
    def heads_per_layer(self) -> list[int]:
        """Heads physically present per layer."""
        return [len(h) for h in self.head_ids]

    @property
    def groups_per_layer(self) -> list[int]:
        """FFN groups physically present per layer (empty list when the FFN is not gated)."""
        return [len(g) for g in self.group_ids]

    @property
    def has_ffn_units(self) -> bool:
        """True when the feed-forward blocks are under the budget (``budget_scope: all``)."""
        return self.ffn_gates is not None

    @property
    def is_pruned(self) -> bool:
        return any(n != self.n_heads for n in self.heads_per_layer) or any(g != self.n_groups for g in self.groups_per_layer)

    @property
    def is_identity_layout(self) -> bool:
        """True when every head (and group) is present in its original order (no surgery, no sorting)."""
        groups_identity = not self.group_ids or self.group_ids == identity_head_ids(self.n_layers, self.n_groups)
        return self.head_ids == identity_head_ids(self.n_layers, self.n_heads) and groups_identity

    @property
    @abstractmethod
    def max_len(self) -> int:
        """Longest input sequence the model accepts, in tokens."""

    def active_heads(self) -> list[int]:
        """Heads used per layer in forward: a prefix of the physical heads (instant switching)."""
        return list(self._active)

    def active_head_ids(self) -> list[list[int]]:
        """Original indices of the heads the forward pass runs, per layer."""
        return [ids[:n] for ids, n in zip(self.head_ids, self._active)]

    def active_group_ids(self) -> list[list[int]]:
        """Original indices of the FFN groups the forward pass runs, per layer."""
        return [ids[:n] for ids, n in zip(self.group_ids, self._active_groups)]

    def active_ffn_widths(self) -> list[int] | None:
        """FFN neurons run per layer, or None when the FFN is not gated (always whole)."""
        return [n * self.group_size for n in self._active_groups] if self.has_ffn_units else None

    # ------------------------------------------------------------------ gates

    def unit_gates(self, budget: float) -> UnitGates:
        """Soft gates g(b) of every unit: heads, and FFN groups when they are gated. Full grids."""
        return UnitGates(self.gates(budget), None if self.ffn_gates is None else self.ffn_gates(budget))

    def unit_importance(self, grid_points: int = 20) -> UnitGates:
        """Budget-invariant importance of every unit (area under its gate curve), full grids."""
        return UnitGates(
            self.gates.importance(grid_points), None if self.ffn_gates is None else self.ffn_gates.importance(grid_points)
        )

    def centre_gates(self, budgets: UnitGates) -> None:
        """Centre every unit's gate curve at its entry budget (:meth:`BudgetGates.centre`), e.g. a
        ranking's :meth:`~budgeted_attention.pruning.selection.Ranking.admission_budgets`: the
        soft gates then start ordered as that ranking (``train.gate_init: importance``)."""
        if (budgets.ffn is None) != (self.ffn_gates is None):
            raise ValueError("gate entry budgets must cover the FFN groups exactly when they are gated")
        self.gates.centre(budgets.heads)
        if self.ffn_gates is not None:
            self.ffn_gates.centre(budgets.ffn)

    def unit_costs(self, seq_len: int) -> UnitGates:
        """FLOPs per unit at ``seq_len`` tokens: heads, and FFN groups when they are gated."""
        return self.cost_model(seq_len).unit_costs(self.group_size if self.has_ffn_units else 0)

    def _check_gates(self, gates: UnitGates) -> None:
        if tuple(gates.heads.shape[-2:]) != (self.n_layers, self.n_heads) or gates.heads.ndim not in (2, 3):
            raise ValueError(
                f"gates must have the full-grid shape ({self.n_layers}, {self.n_heads}) even for a pruned model "
                f"(or (batch, {self.n_layers}, {self.n_heads}) per input), got {tuple(gates.heads.shape)}"
            )
        if gates.heads.ndim == 3 and gates.ffn is not None:
            raise ValueError("per-input gates cover heads only; FFN group gates must be None")
        if gates.ffn is not None:
            if not self.has_ffn_units:
                raise ValueError("FFN gates given, but this model's feed-forward blocks are not gated (ffn_group_size 0)")
            if tuple(gates.ffn.shape) != (self.n_layers, self.n_groups):
                raise ValueError(f"FFN gates must have the full-grid shape ({self.n_layers}, {self.n_groups}), got {tuple(gates.ffn.shape)}")

    def layer_selections(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        budget: float | None = None,
        gates: torch.Tensor | UnitGates | None = None,
    ) -> list[LayerSelection]:
        """What each layer runs in this forward pass (one :class:`LayerSelection` per layer).

        Args:
            input_ids, attention_mask: the batch (a per-input router pools them).
            budget: budget in (0, 1]; b = 1 is the ungated dense path.
            gates: explicit full-grid gates (overrides ``budget`` and the router):
                :class:`UnitGates`, or a bare (n_layers, n_heads) or per-input
                (batch, n_layers, n_heads) tensor of head gates (the FFN ungated).

        Returns:
            Per layer, the gates of the active physical heads and FFN groups (re-indexed to the
            stored layout), or the router's choice: soft per-input gates in training, a
            per-input hard selection for a batch, one head set per layer for one input.
        """
        if gates is None and self.router is not None:
            return self._routed_selections(input_ids, attention_mask, budget)
        if isinstance(gates, torch.Tensor):  # the public call's bare head gates: the one conversion
            gates = UnitGates(gates)
        if gates is not None:
            self._check_gates(gates)
            # masks built on the CPU (rankings) follow the model to a GPU
            resolved = gates.map(lambda t: t.to(self.gates.bias.device))
        elif budget is None or validate_budget(budget) == 1.0:
            return [DENSE] * self.n_layers  # g(1) = 1 for every unit: b = 1 is the dense model, no gate code
        else:
            resolved = self.unit_gates(budget)
        if self._gate_index is None:
            self._gate_index = _unit_index(self.active_head_ids(), self.n_heads), _unit_index(self.active_group_ids(), self.n_groups)
        heads = _reindex(resolved.heads, self._gate_index[0])
        if resolved.ffn is None:
            return [LayerSelection(gates=g) for g in heads]
        return [LayerSelection(gates=g, ffn=f) for g, f in zip(heads, _reindex(resolved.ffn, self._gate_index[1]))]

    def head_positions(self, sets: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Per layer, the physical positions (ascending) of the head ids in ``sets`` (one set per layer)."""
        if len(sets) != self.n_layers:
            raise ValueError(f"head sets must give one set per layer ({self.n_layers}), got {len(sets)}")
        if self._position_of is None:
            self._position_of = [{head: pos for pos, head in enumerate(ids)} for ids in self.active_head_ids()]
        if any(len(set(heads)) != len(heads) for heads in sets):
            raise ValueError(f"head sets must not repeat a head, got {sets}")
        try:
            return [tuple(sorted(where[h] for h in heads)) for where, heads in zip(self._position_of, sets)]
        except KeyError as exc:
            raise ValueError(f"head set names head {exc.args[0]}, which this model does not run") from None

    # ------------------------------------------------------------------ per-input routing

    def attach_router(self, cfg: RouterConfig) -> HeadRouter:
        """Give the model a per-input head router (BudgetFormer, or its budget-capped variant) on its
        full (n_layers, n_heads) grid; returns it. Only on the unpruned layout: the router's choices
        are per input, so the model keeps every head."""
        if not self.supports_routing:
            raise ValueError(f"the {self.family} family has no per-input head routing (encoder and bert families have)")
        if self.is_pruned:
            raise ValueError("attach a head router to the unpruned model: per-input routing needs every head")
        router = HeadRouter(self.input_embedding().embedding_dim, self.n_layers, self.n_heads, cfg)
        device = self.input_embedding().weight.device
        self.router = router.to(device).train(self.training)  # a router attached to an eval model decides hard
        return self.router

    def _routed_selections(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, budget: float | None
    ) -> list[LayerSelection]:
        """The router's choice as per-layer selections (see :meth:`layer_selections`). A capped
        router at b = 1 is the dense model."""
        if self.is_pruned or self._active != self.heads_per_layer:
            raise ValueError("a model with a head router must keep and run every head (no surgery, no slicing): the router picks per input")
        if self.router.cfg.mode == "capped" and (budget is None or validate_budget(budget) == 1.0):
            return [DENSE] * self.n_layers
        pooled = pooled_embeddings(self.input_embedding(), input_ids, attention_mask)
        if self.router.training:  # soft (or straight-through) per-input gates, (batch, n_layers, n_heads)
            return [LayerSelection(gates=g) for g in self.router.decide(pooled, budget).unbind(1)]
        if input_ids.shape[0] == 1:
            return [LayerSelection(heads=h) for h in self.head_positions(self.router.decide_sets(pooled, budget))]
        return [LayerSelection(chosen=c) for c in self.router.decide(pooled, budget).unbind(1)]

    @abstractmethod
    def input_embedding(self) -> nn.Embedding:
        """Family hook: the token embedding table (the router pools it over the input)."""

    # Our tokenizers keep the first ids for their special tokens ([PAD], [UNK], [CLS] or <pad>,
    # <eod>, <unk>); a family with another vocabulary layout overrides ``special_ids``.
    special_ids = 3

    @property
    def vocab_size(self) -> int:
        """Rows of the token embedding: token ids are in [0, vocab_size)."""
        return self.input_embedding().num_embeddings

    @property
    @abstractmethod
    def pad_id(self) -> int:
        """Family hook: the id padding positions carry (synthetic padded inputs use it)."""

    def first_ordinary_id(self) -> int:
        """The first id of an ordinary word token, the low end of every synthetic input (bench,
        export, serving warm-up), so that none of them draws the pad or another special token;
        capped for tiny test vocabularies."""
        vocab = self.input_embedding().num_embeddings
        low = min(self.special_ids, max(0, vocab // 2))
        return min(max(low, self.pad_id + 1), vocab - 1)  # never the pad id, wherever it sits

    # ------------------------------------------------------------------ surgery and slicing

    @staticmethod
    def _positions(kept: list[list[int]], present_ids: list[list[int]], n_layers: int, n_units: int, what: str) -> list[list[int]]:
        """Storage positions of the kept original unit ids, per layer (checked)."""
        if len(kept) != n_layers:
            raise ValueError(f"expected {n_layers} {what} lists, got {len(kept)}")
        kept = validate_head_ids(kept, n_layers, n_units)
        positions = []
        for layer, units in enumerate(kept):
            present = present_ids[layer]
            missing = [u for u in units if u not in present]
            if missing:
                raise ValueError(f"layer {layer} no longer has {what}(s) {missing} (present: {present})")
            positions.append([present.index(u) for u in units])
        return positions

    @torch.no_grad()
    def keep_units(self, heads: list[list[int]], groups: list[list[int]] | None = None) -> None:
        """Physically keep, per layer, the heads ``heads[l]`` and FFN groups ``groups[l]``
        (ORIGINAL indices, in that order; ``groups`` None leaves the FFN as it is).

        Works on pruned and sorted models too, as long as every requested unit is still present.
        Uneven counts and empty layers are allowed.
        """
        head_positions = self._positions(heads, self.head_ids, self.n_layers, self.n_heads, "head")
        group_positions = None
        if groups is not None:
            if not self.has_ffn_units:
                raise ValueError("FFN groups given, but this model's feed-forward blocks are not gated (ffn_group_size 0)")
            group_positions = self._positions(groups, self.group_ids, self.n_layers, self.n_groups, "FFN group")
        self._physical_keep(head_positions)
        self.head_ids = [[int(h) for h in layer] for layer in heads]
        self._active = [len(h) for h in self.head_ids]
        if group_positions is not None:
            gs = self.group_size
            self._keep_neurons([[p * gs + i for p in layer for i in range(gs)] for layer in group_positions])
            self.group_ids = [[int(g) for g in layer] for layer in groups]  # type: ignore[union-attr]
            self._active_groups = [len(g) for g in self.group_ids]
        self._gate_index = self._position_of = None
        self.layout_version += 1
        self._after_surgery()

    def set_active(self, head_counts: list[int], group_counts: list[int] | None = None) -> None:
        """Run only the first ``head_counts[l]`` physical heads (and ``group_counts[l]`` FFN groups)
        of layer l: views of the weights, no copies."""
        self._check_counts(head_counts, self.heads_per_layer, "head")
        if group_counts is not None:
            if not self.has_ffn_units:
                raise ValueError("FFN group counts given, but this model's feed-forward blocks are not gated")
            self._check_counts(group_counts, self.groups_per_layer, "FFN group")
        self._set_active(list(head_counts))
        self._active = list(head_counts)
        if group_counts is not None:
            self._set_active_ffn(list(group_counts))
            self._active_groups = list(group_counts)
        self._gate_index = self._position_of = None

    def _check_counts(self, counts: list[int], present: list[int], what: str) -> None:
        if len(counts) != self.n_layers:
            raise ValueError(f"expected {self.n_layers} {what} counts, got {counts!r}")
        for layer, (count, have) in enumerate(zip(counts, present)):
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= have:
                raise ValueError(f"active {what} count of layer {layer} must be in [0, {have}], got {count!r}")

    def pruned_copy(self, kept: list[list[int]], groups: list[list[int]] | None = None) -> GatedModel:
        """A physically smaller copy keeping ``kept[l]`` original heads (and ``groups[l]`` FFN groups)
        per layer (eval mode)."""
        copied = copy.deepcopy(self)
        copied.keep_units(kept, groups)
        return copied.eval()

    @torch.no_grad()
    def sort_ffn_neurons(self, orders: list[list[int]]) -> None:
        """Permute each layer's FFN neurons into ``orders[l]`` (function-preserving), so that groups
        of consecutive neurons hold neurons of similar importance. Only on the unpruned layout."""
        if not self.is_identity_layout:
            raise ValueError("sort the FFN neurons before any pruning or sorting of units")
        if self._active != self.heads_per_layer or self._active_groups != self.groups_per_layer:
            raise ValueError("sort the FFN neurons with every unit active (not on a sliced model)")
        widths = self.ffn_widths()
        if len(orders) != self.n_layers:
            raise ValueError(f"expected {self.n_layers} neuron orders, got {len(orders)}")
        for layer, (order, width) in enumerate(zip(orders, widths)):
            if sorted(int(i) for i in order) != list(range(width)):
                raise ValueError(f"neuron order of layer {layer} must be a permutation of range({width})")
        self._keep_neurons([[int(i) for i in order] for order in orders])
        self.layout_version += 1

    # ------------------------------------------------------------------ family hooks

    @abstractmethod
    def _physical_keep(self, positions: list[list[int]]) -> None:
        """Keep physical heads at ``positions[l]`` (storage positions, in that order)."""

    @abstractmethod
    def _set_active(self, counts: list[int]) -> None:
        """Run the first ``counts[l]`` physical heads of layer l (views of the weights)."""

    def _after_surgery(self) -> None:
        """Family hook: refresh derived state (e.g. a config) after :meth:`keep_units`."""

    @abstractmethod
    def _keep_neurons(self, neurons: list[list[int]]) -> None:
        """Keep (or permute) the FFN neurons at storage positions ``neurons[l]``, in that order:
        rows of the first linear, columns of the second (surgery of groups, neuron sorting)."""

    @abstractmethod
    def _set_active_ffn(self, counts: list[int]) -> None:
        """Run the first ``counts[l]`` physical FFN groups of layer l (views of the weights)."""

    @abstractmethod
    def ffn_widths(self) -> list[int]:
        """Physical FFN neurons per layer."""

    @abstractmethod
    def ffn_activations(self) -> list[nn.Module]:
        """Per layer, the module whose output is the FFN hidden activation (batch, seq, width):
        used to score neurons by gradient x activation on training data."""

    @abstractmethod
    def cost_model(self, seq_len: int) -> CostModel:
        """FLOP cost model of the full (unpruned) architecture at ``seq_len`` tokens."""

    @abstractmethod
    def lean_unsupported(self, *, routed: bool = False) -> str | None:
        """What this model has that its family's lean executor does not run, as a noun phrase
        (e.g. ``"meta-attention (...)"``); None when :meth:`inference_module` builds one.
        ``routed``: as for :meth:`inference_module`. The runtimes serving through the executor
        (:class:`~budgeted_attention.model.lean.LeanFollower`) ask this and run the module tree
        where it names something."""

    @abstractmethod
    def inference_module(self, *, routed: bool = False) -> nn.Module:
        """The family's lean executor of the current layout (same weights and kernels, less
        framework code): the second of the family's two forward paths, the module tree being the
        first (training, soft gates).

        ``routed``: an executor of a model with a per-input router, made although the router is
        attached; it runs the per-layer head sets it is given (``copy(ids, mask, head_sets=...)``,
        stored positions) and leaves deciding them to the router
        (:class:`~budgeted_attention.model.routed_inference.RoutedInference` does both).

        Called as ``module(input_ids, attention_mask, token_type_ids)``; logits equal ``self(ids,
        mask)`` up to float rounding. Inference only: it neither gates nor routes, and it is a
        snapshot (later surgery or ``set_active`` on ``self`` does not reach it) with its own
        ``set_active`` and ``is_current`` (:class:`~budgeted_attention.model.lean.LeanCopy`), by
        which :class:`~budgeted_attention.model.lean.LeanFollower` keeps it in step.

        Raises:
            BAAError: "the <family> family's lean executor does not run <feature>", the feature
                :meth:`lean_unsupported` names.
        """

    def library_references(self) -> dict[str, nn.Module]:
        """The unmodified library model users run instead (name -> module called as ``(ids, mask, token_type_ids) -> logits``;
        at most one: ``baa bench`` reports ``library_speedup`` against it), e.g. transformers; empty when the family has none."""
        return {}

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Loss terms the model's own modules produced in training forward passes since the last
        call (e.g. Meta-Attention's weighted KL, the head router's entropy and budget hinge), then
        cleared; None when there are none. The training stages add it to every step's loss."""
        return None if self.router is None else self.router.take_loss()

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-serialisable architecture (including ``head_ids``) that :meth:`from_description` rebuilds."""

    @classmethod
    @abstractmethod
    def from_description(cls, description: dict[str, Any]) -> GatedModel:
        """A model of the described architecture (weights to be loaded afterwards)."""


def _unit_index(active_ids: list[list[int]], n_units: int) -> list[torch.Tensor] | None:
    """Per layer, the active units' original ids as an index tensor; None for the identity layout."""
    if active_ids == identity_head_ids(len(active_ids), n_units):
        return None
    return [torch.tensor(ids, dtype=torch.long) for ids in active_ids]


def _reindex(matrix: torch.Tensor, index: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """Per layer, the gates of the active physical units: (units,) from a (layers, units) grid,
    or (batch, units) from per-input (batch, layers, units) gates."""
    dim = matrix.ndim - 2  # the layer axis
    if index is None:
        return list(matrix.unbind(dim))
    return [matrix.select(dim, layer).index_select(-1, ids.to(matrix.device)) for layer, ids in enumerate(index)]
