"""
Hidden (the grader's): assignment 1's training mask against docs/method.md's four rules written
out element by element (a phase per row), and assignment 2's loss against Eq. 14 computed slot by
slot in float64. Each could stand in for the function it checks, so it stays out of a handout;
tests/test_model.py, tests/test_training.py and tests/test_assignment_1.py and _2.py check the
same functions on matrices and values worked out by hand and by their properties.
"""

import pytest
import torch

import sbd
from model import IGNORE_INDEX


def mask_by_the_rules(L, k, phase):
    """docs/method.md's four rules, 1-based as written there, blocks of k starting at phase + 1,
    phase + 1 ± k, ..."""
    T = 2 * L
    mask = torch.zeros(T, T, dtype=torch.bool)
    block = lambda i: (i - 1 - phase) // k  # block of 1-based noisy position i
    for q in range(T):
        for key in range(T):
            q_clean, k_clean = q < L, key < L
            i, j = q % L + 1, key % L + 1  # 1-based positions within each half
            if q_clean and k_clean:
                mask[q, key] = j <= i
            elif not q_clean and k_clean:
                mask[q, key] = j < block(i) * k + phase + 1  # clean tokens before the block starts
            elif not q_clean and not k_clean:
                mask[q, key] = block(j) == block(i)
    return mask


@pytest.mark.parametrize("L, k, phases", [(8, 4, [0, 1, 2, 3]), (11, 3, [0, 2]), (10, 16, [0, 7])])
def test_training_mask_follows_the_rules_per_row_phase(L, k, phases):
    masks = sbd.training_mask(L, k, torch.tensor(phases))
    for row, phase in enumerate(phases):
        assert torch.equal(masks[row], mask_by_the_rules(L, k, phase)), f"phase {phase}"


def test_loss_is_one_cross_entropy_over_all_labelled_positions():
    """Eq. 14 (docs/method.md, Loss): -log p of every labelled position, NTP and masked tokens
    alike, averaged."""
    g = torch.Generator().manual_seed(0)
    B, L, V = 3, 6, 7
    logits = torch.randn(B, 2 * L, V, generator=g)
    labels = torch.randint(0, V, (B, 2 * L), generator=g)
    labels[torch.rand(B, 2 * L, generator=g) < 0.4] = IGNORE_INDEX
    nll = {"clean": [], "noisy": []}
    for b in range(B):
        for i in range(2 * L):
            if labels[b, i] != IGNORE_INDEX:
                p = torch.softmax(logits[b, i].double(), dim=0)[labels[b, i]]
                nll["clean" if i < L else "noisy"].append(-torch.log(p).item())
    mean = lambda xs: sum(xs) / len(xs)
    loss, ntp, masked = sbd.sbd_loss(logits, labels, L)
    assert loss.item() == pytest.approx(mean(nll["clean"] + nll["noisy"]), rel=1e-5), (
        "loss: one mean of -log p over every labelled slot of both halves (Eq. 14), not the mean "
        "of the two halves' means")
    assert ntp.item() == pytest.approx(mean(nll["clean"]), rel=1e-5), (
        "ntp_loss: the plain mean over the labelled slots of the clean half (the first L)")
    assert masked.item() == pytest.approx(mean(nll["noisy"]), rel=1e-5), (
        "masked_loss: the plain mean over the labelled slots of the noisy half (after the first L)")
    loss_without_ntp, _, _ = sbd.sbd_loss(logits, labels, L, ntp_weight=0.0)  # the paper's ablation
    assert loss_without_ntp.item() == pytest.approx(mean(nll["noisy"]), rel=1e-5), (
        "the loss is the weighted mean sum(w * nll) / sum(w), w = ntp_weight on labelled clean "
        "slots and 1 on labelled noisy ones: at ntp_weight=0 it is the masked-token mean")
