"""Training hyper-parameters."""

from __future__ import annotations

from dataclasses import dataclass

from budgeted_attention.config import check_float, check_int
from budgeted_attention.errors import ConfigError


@dataclass
class TrainConfig:
    """Hyper-parameters of the three training stages (steps are optimiser steps).

    Budget sampling (``budget_sampling``): ``single`` (default, the paper): each budgeted (and
    hard) step uses b = 1 with probability ``full_budget_prob`` and otherwise draws
    b ~ Uniform[budget_min, budget_max]. ``sandwich``: each step runs the full model, b = budget_min
    and ``sandwich_random`` uniform budgets, the sub-models distilled from the full model's output.
    Where: ``device`` (``auto``: CUDA when available, else the CPU) and ``bf16`` (bfloat16
    autocast, CUDA only); under ``torchrun`` each process uses its own GPU (see
    :mod:`budgeted_attention.training.distributed`). ``batch_size`` is the *global* batch.
    Early stopping of the dense stage: with ``early_stopping_patience`` > 0, validation accuracy
    is computed every ``eval_every`` steps and training stops after that many evaluations
    without improvement (``dense_steps`` is then the maximum). ``early_stop_budgeted``: the soft
    and hard budgeted stages are early-stopped the same way, on the mean validation score over
    the experiment's budgets (soft gates at each budget; the hard stage: each budget's kept units),
    so every stage of the path keeps weights chosen on validation, as the dense model and the
    ladder do.
    Budgeted loss: CE + overshoot_weight * relu(C(b) - b + overshoot_margin)
                   + gate_mass_weight * C(b)
                   + polarization_weight * mean(g (1 - g)) + distill_weight * KL(teacher || student).
    Gate forward (``gate_forward``): ``soft`` (default, the paper) runs the soft gates g(b).
    ``straight-through`` runs the hard selection of the sampled budget (the units the hard stage
    would keep: ranked by the area under their gate curves, cut at b) and passes the gradient to
    g(b) unchanged (straight-through estimator); the budget term becomes the two-sided
    overshoot_weight * (C(b) - b)^2, which only anchors the gates' level, since the forward meets
    the budget by construction. For families whose branch outputs are normalised before the
    residual add (Gemma 3's sandwich norms), scaling every unit of a layer by one gate changes
    nothing, so soft gates can meet the budget by shrinking together and never rank the units;
    the straight-through forward makes every step pay for the units it drops. With it,
    ``polarization_weight``, ``gate_mass_weight`` and ``overshoot_margin`` are not used, and what
    still reads the soft gates (the ``budgeted`` rows, early stopping of the budgeted stage, the
    hard stage's teacher) sees a soft forward this stage did not train.
    Gate initialisation (``gate_init``): ``zeros`` (default, the paper: every gate starts as
    g(b) = b, so the units start unordered) or ``importance``: the warm-started budgeted stages
    (``budgeted``, ``budgeted-sandwich``) start with each unit's gate curve centred at the budget
    where the post-hoc importance ranking of the dense model (``posthoc_importance``, on the
    validation split) first keeps it, so the soft gates start ordered as that ranking and the
    stage refines it. For families whose branch outputs are normalised (Gemma 3's sandwich
    norms), the gates of one layer cannot learn their order from a common start.
    ``freeze_embeddings``: every stage leaves the token embedding (the family's
    ``input_embedding()``, and with it an output layer tied to it) untouched: no gradient, no
    optimiser state. For a pretrained decoder whose vocabulary dominates its parameters (Gemma 3
    270M: 168 M of 270 M) this removes the embedding's weight gradient, its AdamW moments and its
    update from every step.
    ``hard_budget_min``: the lowest budget the hard stage samples (default: ``budget_min``). The
    hard stage trains the sub-models of the sampled budgets in turn with shared weights; steps at
    budgets whose sub-model is still broken can cost the middle budgets more than they gain (on
    Gemma 3 270M, bbc-short: docs/method.md), so the hard stage may start higher than the soft one.

    Valid values (checked on construction, ``ConfigError`` naming ``train.<key>``): batch sizes
    >= 1; step counts >= 0; learning rates and ``distill_temperature`` finite > 0; ``weight_decay``,
    ``grad_clip`` (0 = no clipping) and the loss weights finite >= 0; ``warmup_frac`` in [0, 1);
    ``overshoot_margin`` finite; 0 < ``budget_min`` <= ``budget_max`` <= 1; 0 < ``hard_budget_min``
    <= ``budget_max`` (or null).
    """

    batch_size: int = 64
    eval_batch_size: int = 512
    lr: float = 1e-3
    gate_lr: float = 2e-2
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    dense_steps: int = 1500
    budgeted_steps: int = 1500
    scratch_steps: int = 0
    hard_steps: int = 600
    hard_lr: float = 3e-4
    recovery_steps: int = 0
    budget_min: float = 0.1
    budget_max: float = 1.0
    full_budget_prob: float = 0.1
    early_stopping_patience: int = 0
    eval_every: int = 50
    early_stop_budgeted: bool = False
    overshoot_weight: float = 5.0
    overshoot_margin: float = 0.01
    gate_mass_weight: float = 0.0
    polarization_weight: float = 1.0
    distill_weight: float = 0.5
    distill_temperature: float = 2.0
    budget_sampling: str = "single"
    gate_forward: str = "soft"
    gate_init: str = "zeros"
    freeze_embeddings: bool = False
    hard_budget_min: float | None = None
    sandwich_random: int = 2
    device: str = "auto"
    bf16: bool = False

    def __post_init__(self) -> None:
        """Check every value (types too: NaN, infinities and bools are refused), naming ``train.<key>``."""
        for name in ("batch_size", "eval_batch_size"):
            check_int(getattr(self, name), f"train.{name}", ge=1)
        for name in ("dense_steps", "budgeted_steps", "scratch_steps", "hard_steps", "recovery_steps"):
            check_int(getattr(self, name), f"train.{name}", ge=0)
        for name in ("lr", "gate_lr", "hard_lr", "distill_temperature"):
            setattr(self, name, check_float(getattr(self, name), f"train.{name}", gt=0.0))
        for name in (
            "weight_decay", "grad_clip", "overshoot_weight", "gate_mass_weight", "polarization_weight", "distill_weight",
        ):
            setattr(self, name, check_float(getattr(self, name), f"train.{name}", ge=0.0))
        self.warmup_frac = check_float(self.warmup_frac, "train.warmup_frac", ge=0.0, lt=1.0)
        self.overshoot_margin = check_float(self.overshoot_margin, "train.overshoot_margin")
        self.budget_min = check_float(self.budget_min, "train.budget_min", gt=0.0, le=1.0)
        self.budget_max = check_float(self.budget_max, "train.budget_max", gt=0.0, le=1.0)
        if self.hard_budget_min is not None:
            self.hard_budget_min = check_float(self.hard_budget_min, "train.hard_budget_min", gt=0.0, le=self.budget_max)
        self.full_budget_prob = check_float(self.full_budget_prob, "train.full_budget_prob", ge=0.0, le=1.0)
        check_int(self.early_stopping_patience, "train.early_stopping_patience", ge=0)
        check_int(self.eval_every, "train.eval_every", ge=1)
        check_int(self.sandwich_random, "train.sandwich_random", ge=0)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"train.device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if not isinstance(self.early_stop_budgeted, bool):
            raise ConfigError(f"train.early_stop_budgeted must be true or false, got {self.early_stop_budgeted!r}")
        if not isinstance(self.freeze_embeddings, bool):
            raise ConfigError(f"train.freeze_embeddings must be true or false, got {self.freeze_embeddings!r}")
        if not isinstance(self.bf16, bool):
            raise ConfigError(f"train.bf16 must be true or false, got {self.bf16!r}")
        if self.budget_sampling not in ("single", "sandwich"):
            raise ConfigError(f"train.budget_sampling must be 'single' or 'sandwich', got {self.budget_sampling!r}")
        if self.gate_forward not in ("soft", "straight-through"):
            raise ConfigError(f"train.gate_forward must be 'soft' or 'straight-through', got {self.gate_forward!r}")
        if self.gate_init not in ("zeros", "importance"):
            raise ConfigError(f"train.gate_init must be 'zeros' or 'importance', got {self.gate_init!r}")
        if self.gate_forward == "straight-through" and self.budget_sampling != "single":
            raise ConfigError("train.gate_forward 'straight-through' needs train.budget_sampling 'single', got 'sandwich'")
        if self.budget_min > self.budget_max:
            raise ConfigError(
                f"train.budget_min/budget_max must satisfy 0 < min <= max <= 1, "
                f"got {self.budget_min!r}, {self.budget_max!r}"
            )

    def epoch_steps(self, n_examples: int) -> int:
        """Optimiser steps in one pass over ``n_examples``."""
        return max(1, -(-n_examples // self.batch_size))
