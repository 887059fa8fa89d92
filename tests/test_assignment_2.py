"""
Assignment 2 (the SBD objective), checks beyond test_training.py: the noise is a function of the
generator alone (train.py's exact resume depends on it), and the loss sends gradient to the labelled
positions only, to the clean half not at all when ntp_weight=0 (exact zeros, whatever order the sums
are taken in).
"""

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
