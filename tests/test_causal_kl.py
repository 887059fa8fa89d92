"""
The soft-target term (train.py kl_weight, sbd.causal_kl): which masked slots get the causal head's
distribution as a target, and the KL itself, against a hand-written case and a loop over positions.
"""

import torch

import sbd
from model import IGNORE_INDEX


def test_pairs_of_a_hand_written_case():
    # L = 8, k = 4, phase 0, noisy half from position 0: blocks {0..3} and {4..7}.
    # Masked positions 1, 2, 5, 7: position 1 is the first masked in block 0 (0 is clean), 2 is not
    # (1 is masked); 5 is the first in block 1, 7 is not. Their causal twins: clean slots 0 and 4.
    L = 8
    labels = torch.full((1, 2 * L), 3)  # every clean slot labelled
    labels[0, L:] = IGNORE_INDEX
    labels[0, L + torch.tensor([1, 2, 5, 7])] = 5
    rows, noisy, clean = sbd.causal_pairs(labels, L, 4, torch.tensor([0]))
    assert rows.tolist() == [0, 0]
    assert noisy.tolist() == [L + 1, L + 5]
    assert clean.tolist() == [0, 4]
    # phase 2: blocks {.., 0, 1}, {2..5}, {6, 7}: 1 first in its block, 2 and 7 first in theirs
    rows, noisy, clean = sbd.causal_pairs(labels, L, 4, torch.tensor([2]))
    assert noisy.tolist() == [L + 1, L + 2, L + 7] and clean.tolist() == [0, 1, 6]


def pairs_by_loop(labels, L, k, phases):
    """The definition, position by position: masked, not position 0, no masked position earlier in
    its block, and the clean slot one position earlier labelled."""
    B, T = labels.shape
    s = 2 * L - T
    pairs = []
    for b in range(B):
        masked = {i for i in range(s, L) if labels[b, L + i - s] != IGNORE_INDEX}
        for i in sorted(masked):
            start = (i - int(phases[b])) // k * k + int(phases[b])
            if i >= 1 and not masked & set(range(start, i)) and labels[b, i - 1] != IGNORE_INDEX:
                pairs.append((b, L + i - s, i - 1))
    return pairs


def kl_by_loop(logits, pairs):
    total = 0.0
    for b, noisy, clean in pairs:
        p = torch.softmax(logits[b, clean].double(), -1)
        q = torch.softmax(logits[b, noisy].double(), -1)
        total += float((p * (p.log() - q.log())).sum())
    return total / len(pairs)


def real_batch(seed, B=4, L=24, V=11, k=5):
    """sbd_inputs of random rows whose answer starts at a random position past a few prompt
    tokens: the labels and the noisy start are those training uses."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V - 1, (B, L), generator=g)
    prompt = torch.randint(2, 9, (B, 1), generator=g)
    answer = torch.arange(L)[None] >= prompt  # (B, L)
    y = torch.where(torch.roll(answer, -1, 1), torch.roll(x, -1, 1), IGNORE_INDEX)
    y[:, -1] = IGNORE_INDEX
    phases = prompt[:, 0] % k
    idx, pos, mask, labels = sbd.sbd_inputs(x, y, V - 1, k, phases, answer, g)
    return labels, phases, V, k, L, g


def test_pairs_and_kl_equal_the_loop_definition():
    for seed in range(6):
        labels, phases, V, k, L, g = real_batch(seed)
        rows, noisy, clean = sbd.causal_pairs(labels, L, k, phases)
        pairs = pairs_by_loop(labels, L, k, phases)
        assert list(zip(rows.tolist(), noisy.tolist(), clean.tolist())) == pairs
        assert len(pairs) > 0
        logits = torch.randn(*labels.shape, V, generator=g)
        kl = sbd.causal_kl(logits, labels, L, k, phases)
        assert abs(kl.item() - kl_by_loop(logits, pairs)) < 1e-5
        # the same term from logits at the labelled slots only (head_at_labels)
        at = labels != IGNORE_INDEX
        assert torch.allclose(sbd.causal_kl(logits[at], labels, L, k, phases), kl, atol=1e-6)


def test_kl_teaches_the_masked_slots_only():
    labels, phases, V, k, L, g = real_batch(7)
    logits = torch.randn(*labels.shape, V, generator=g, requires_grad=True)
    sbd.causal_kl(logits, labels, L, k, phases).backward()
    _, noisy, clean = sbd.causal_pairs(labels, L, k, phases)
    has_grad = logits.grad.abs().sum(-1) > 0  # (B, T)
    expected = torch.zeros_like(has_grad)
    expected[sbd.causal_pairs(labels, L, k, phases)[0], noisy] = True
    assert torch.equal(has_grad, expected)  # the causal (clean) logits are targets, not trained


def test_kl_is_zero_when_the_heads_agree_and_without_pairs():
    labels, phases, V, k, L, g = real_batch(3)
    rows, noisy, clean = sbd.causal_pairs(labels, L, k, phases)
    logits = torch.randn(*labels.shape, V, generator=g)
    logits[rows, noisy] = logits[rows, clean]
    assert sbd.causal_kl(logits, labels, L, k, phases).item() < 1e-6
    no_mask = labels.clone()
    no_mask[:, L:] = IGNORE_INDEX
    assert sbd.causal_kl(logits, no_mask, L, k, phases).item() == 0.0
