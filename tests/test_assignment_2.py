"""
Assignment 2 (the SBD objective), checks beyond test_training.py: the noise is a function of the
generator alone (train.py's exact resume depends on it); the loss sends gradient to the labelled
positions only, to the clean half not at all when ntp_weight=0 (exact zeros, whatever order the sums
are taken in); and the loss of logits whose probabilities are known, at ntp_weight 1, 0.5 and 0, in
both forms of the logits ((B, T, V), and (N, V) at the labelled slots). Eq. 14 computed slot by
slot is a hidden test (tests/hidden/test_hidden_training.py).
"""

import math

import pytest
import torch

import sbd
from model import IGNORE_INDEX


def test_noise_follows_the_generator():
    x = torch.randint(0, 50, (8, 30), generator=torch.Generator().manual_seed(0))
    maskable = torch.arange(30).expand(8, 30) >= 5
    a = sbd.add_noise(x, 99, maskable, torch.Generator().manual_seed(1))
    b = sbd.add_noise(x, 99, maskable, torch.Generator().manual_seed(1))
    c = sbd.add_noise(x, 99, maskable, torch.Generator().manual_seed(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (
        "the same generator state must give the same noise: draw every random number from it")
    assert not torch.equal(a[1], c[1]), "another generator state must give other noise"
    noisy, is_masked = a
    assert is_masked.dtype == torch.bool and noisy.dtype == x.dtype and noisy.shape == x.shape, (
        "add_noise returns (noisy (B, L) with x's dtype, is_masked (B, L) bool)")
    assert torch.equal(noisy, torch.where(is_masked, 99, x)), "mask_id where is_masked, else x"
    assert not (is_masked & ~maskable).any(), "a token outside maskable was masked"


def test_all_masked_rows_shifts_rows_to_masked_whole():
    """all_masked_rows = f masks a token iff u (1 - f) < η: f = 1 masks every maskable token; at
    f = 0.5 a row of n maskable tokens is masked whole with probability f + (1 - f) / (n + 1)
    (η >= 1 - f, or below it all n draws under η / (1 - f) ~ U(0, 1)), and a token with
    probability f + (1 - f) / 2."""
    x = torch.zeros(20_000, 8, dtype=torch.long)
    maskable = torch.arange(8).expand(20_000, 8) >= 1  # 7 maskable tokens a row
    _, is_masked = sbd.add_noise(x, 99, maskable, torch.Generator().manual_seed(0), 1.0)
    assert torch.equal(is_masked, maskable), "all_masked_rows=1: every maskable token masked"
    _, is_masked = sbd.add_noise(x, 99, maskable, torch.Generator().manual_seed(0), 0.5)
    whole = is_masked[:, 1:].all(dim=1).float().mean()
    assert abs(whole - (0.5 + 0.5 / 8)) < 0.015, f"rows masked whole: {whole:.3f}, want 0.5625"
    rate = is_masked[:, 1:].float().mean()
    assert abs(rate - 0.75) < 0.01, f"maskable tokens masked: {rate:.3f}, want 0.75"
    assert not (is_masked & ~maskable).any(), "a token outside maskable was masked"


def test_loss_reaches_only_labelled_positions():
    g = torch.Generator().manual_seed(0)
    B, L, V = 2, 5, 7
    labels = torch.randint(0, V, (B, 2 * L), generator=g)
    labels[torch.rand(B, 2 * L, generator=g) < 0.4] = IGNORE_INDEX
    for ntp_weight in (1.0, 0.0):
        logits = torch.randn(B, 2 * L, V, generator=g, requires_grad=True)
        loss, ntp, masked = sbd.sbd_loss(logits, labels, L, ntp_weight)
        assert loss.dim() == 0 and ntp.dim() == 0 and masked.dim() == 0, "three 0-d tensors"
        assert loss.requires_grad, "the loss must carry the gradient to the logits"
        loss.backward()
        touched = logits.grad.abs().sum(-1) > 0  # (B, 2L)
        expected = labels != IGNORE_INDEX
        if ntp_weight == 0:
            expected[:, :L] = False  # the ablation: no gradient through the NTP half at all
        assert torch.equal(touched, expected), (
            f"ntp_weight={ntp_weight}: the gradient must reach exactly the labelled slots"
            + (" of the noisy half (weight 0 on the clean half)" if ntp_weight == 0 else ""))


def test_loss_of_known_probabilities():
    """One row, L = 3, T = 5, V = 4. Each labelled slot puts probability p on its label: clean
    slots 0, 1 (p = 1/2, 1/4), noisy slots 3, 4 (p = 1/8, 1/2); slot 2 is unlabelled. -log p is
    then ln 2 times 1, 2, 3, 1, and Eq. 14's weighted mean is easy by hand."""
    labels = torch.tensor([[0, 1, IGNORE_INDEX, 2, 3]])
    p = [1 / 2, 1 / 4, 1 / 4, 1 / 8, 1 / 2]  # slot 2's is never read
    logits = torch.empty(1, 5, 4)
    for t, (label, q) in enumerate(zip([0, 1, 0, 2, 3], p)):
        logits[0, t] = math.log((1 - q) / 3)  # the other three tokens share 1 - q
        logits[0, t, label] = math.log(q)
    ln2 = math.log(2)
    at = labels != IGNORE_INDEX
    for form in (logits, logits[at]):  # (B, T, V), and (N, V) at the labelled slots
        for ntp_weight, expected in ((1.0, 7 / 4), (0.5, (0.5 * 3 + 4) / 3), (0.0, 2.0)):
            loss, ntp, masked = sbd.sbd_loss(form, labels, 3, ntp_weight)
            assert loss.item() == pytest.approx(expected * ln2, rel=1e-5), (
                f"ntp_weight={ntp_weight}: the loss is Σ w·nll / Σ w over the labelled "
                "slots, w = ntp_weight on the clean half and 1 on the noisy half")
            assert ntp.item() == pytest.approx(1.5 * ln2, rel=1e-5), (
                "ntp_loss: the plain mean over the labelled clean slots")
            assert masked.item() == pytest.approx(2.0 * ln2, rel=1e-5), (
                "masked_loss: the plain mean over the labelled noisy slots")
