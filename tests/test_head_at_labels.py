"""
The head at labelled slots only (train.py head_at_labels=True, both stages): the same loss and the
same gradients as computing logits at every slot, for less work.
"""

import pytest
import torch

import sbd
from model import IGNORE_INDEX
from tiny_models import random_model


def test_sparse_logits_give_the_same_loss():
    g = torch.Generator().manual_seed(0)
    B, L, V = 3, 6, 7
    logits = torch.randn(B, 2 * L, V, generator=g)
    labels = torch.randint(0, V, (B, 2 * L), generator=g)
    labels[torch.rand(B, 2 * L, generator=g) < 0.4] = IGNORE_INDEX
    at = labels != IGNORE_INDEX
    for weight in (1.0, 0.3, 0.0):
        full = sbd.sbd_loss(logits, labels, L, weight)
        sparse = sbd.sbd_loss(logits[at], labels, L, weight)  # (N, V), row by row
        for a, b in zip(full, sparse):
            assert torch.allclose(a, b, atol=1e-6), (weight, a, b)


def loss_and_grads(m, loss_fn):
    """(loss, the gradients of every parameter flattened into one vector) of loss_fn()."""
    m.zero_grad()
    loss = loss_fn()
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


def assert_same(m, full, sparse):
    (loss_full, grads_full), (loss_sparse, grads_sparse) = (loss_and_grads(m, full),
                                                            loss_and_grads(m, sparse))
    assert loss_full == pytest.approx(loss_sparse, rel=1e-5)
    assert torch.allclose(grads_full, grads_sparse, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt-tiny", "llama-tiny"])
def test_head_at_labels_gives_the_same_loss_and_gradients(family):
    m = random_model(family).float().train()
    g = torch.Generator().manual_seed(1)
    B, L, V = 2, 24, m.config.vocab_size
    x = torch.randint(0, V - 1, (B, L), generator=g)
    y = torch.roll(x, -1, dims=1)
    answer = torch.zeros(B, L, dtype=torch.bool)
    answer[:, 8:] = True
    y[~answer] = IGNORE_INDEX
    phases = torch.tensor([0, 3])
    idx, pos, mask, labels = sbd.sbd_inputs(x, y, V - 1, 4, phases, answer, g)

    def loss_at(at):
        return lambda: sbd.sbd_loss(m(idx, pos=pos, mask=mask, at=at)[0], labels, L)[0]
    assert_same(m, loss_at(None), loss_at(labels != IGNORE_INDEX))


@pytest.mark.parametrize("family", ["gpt-tiny", "llama-tiny"])
def test_ntp_head_at_labels_gives_the_same_loss_and_gradients(family):
    """train.py's NTP stage with head_at_labels: logits at the answer's slots only."""
    m = random_model(family).float().train()
    g = torch.Generator().manual_seed(2)
    B, L, V = 2, 20, m.config.vocab_size
    x = torch.randint(0, V, (B, L), generator=g)
    y = torch.roll(x, -1, dims=1)
    y[0, :7], y[1, :11] = IGNORE_INDEX, IGNORE_INDEX  # prompts of different lengths
    at = y != IGNORE_INDEX
    assert_same(m, lambda: m(x, y)[1], lambda: m(x, y[at], at=at)[1])
