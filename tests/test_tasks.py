"""Tasks: the losses, distillation and metrics that differ between classification and LM."""

import math

import torch
import torch.nn.functional as F

from budgeted_attention.data.dataset import Split
from budgeted_attention.model.decoder import CausalLM, DecoderConfig, lm_loss
from budgeted_attention.tasks import CLASSIFY, LANGUAGE_MODEL, distill_kl


def test_lm_loss_matches_decoder_helper_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    ids = torch.randint(0, 11, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    loss = LANGUAGE_MODEL.loss(logits, ids, mask, torch.zeros(2))
    torch.testing.assert_close(loss, lm_loss(logits, ids, mask))
    total, count = LANGUAGE_MODEL.summed_loss(logits, ids, mask, torch.zeros(2))
    assert count == 5 + 3  # targets 1..5 of row 0, targets 1..3 of row 1
    torch.testing.assert_close(total / count, loss)


def test_classification_loss_and_distill_match_torch():
    torch.manual_seed(0)
    student, teacher, labels = torch.randn(4, 3), torch.randn(4, 3), torch.tensor([0, 2, 1, 1])
    ids = torch.zeros(4, 5, dtype=torch.long)
    torch.testing.assert_close(CLASSIFY.loss(student, ids, ids, labels), F.cross_entropy(student, labels))
    expected = F.kl_div(F.log_softmax(student / 2, -1), F.log_softmax(teacher / 2, -1), log_target=True, reduction="batchmean") * 4
    torch.testing.assert_close(CLASSIFY.distill(student, teacher, ids, 2.0), expected)


def test_lm_distill_counts_real_tokens_only():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 7), torch.randn(2, 4, 7)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    garbage = teacher.clone()
    garbage[1, 2:] += 100.0  # a padded position's outputs must not matter
    assert torch.allclose(LANGUAGE_MODEL.distill(student, teacher, mask, 1.0), LANGUAGE_MODEL.distill(student, garbage, mask, 1.0))
    assert float(distill_kl(teacher, teacher, 1.0)) < 1e-6


def test_lm_evaluate_is_token_weighted_and_reports_perplexity():
    torch.manual_seed(0)
    model = CausalLM(DecoderConfig(vocab_size=13, max_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=16)).eval()
    ids = torch.randint(0, 13, (5, 8))
    split = Split(ids, torch.ones_like(ids), torch.zeros(5, dtype=torch.long))
    metrics = LANGUAGE_MODEL.evaluate(model, split, batch_size=2)
    with torch.no_grad():
        expected = float(lm_loss(model(ids), ids))
    assert math.isclose(metrics["loss"], expected, rel_tol=1e-5)
    assert math.isclose(metrics["perplexity"], math.exp(expected), rel_tol=1e-5)
    assert LANGUAGE_MODEL.score(metrics) == -metrics["loss"]


def test_lm_targets_need_a_real_position_and_a_real_target():
    logits = torch.zeros(1, 5, 7)
    ids = torch.tensor([[0, 0, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])  # left padding: pad position 1 must not predict token 3
    _, count = LANGUAGE_MODEL.summed_loss(logits, ids, mask, torch.zeros(1))
    assert count == 2
