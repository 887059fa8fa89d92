"""
Assignment 4 (reveal rules), checks beyond test_samplers.py: entropy of distributions whose
entropy is known exactly (a one-hot row is 0, not nan: 0 * log 0 counts as 0), and the entropy bound
of Eq. 8 on sorted entropies written with binary fractions, so that every sum is exact and no
comparison depends on rounding; and the left-to-right rule (reveal_left) against the rule written
out per row.
"""

import math

import pytest
import torch
from test_samplers import entropy_of, random_block, reveal_largest_prefix

import sampling


def test_entropy_of_known_distributions():
    for dtype in (torch.float32, torch.float64):
        V = 8
        probs = torch.zeros(2, 3, V, dtype=dtype)  # (B, k, V)
        probs[0, 0, 3] = 1.0  # one-hot: entropy 0
        probs[0, 1] = 1.0 / V  # uniform: log V
        probs[0, 2, :2] = 0.5  # two equal outcomes: log 2
        logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0), dtype=dtype)
        probs[1] = torch.softmax(logits, -1)
        h = sampling.entropy(probs)
        assert h.shape == (2, 3) and not torch.isnan(h).any()
        assert h[0, 0] == 0
        expected = [math.log(V), math.log(2)] + [-sum(p * math.log(p) for p in row)
                                                 for row in probs[1].tolist()]
        got = [h[0, 1].item(), h[0, 2].item()] + h[1].tolist()
        assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(got, expected)), (got, expected)


def test_entropy_bound_by_hand():
    # sorted entropies of the masked slots, then unmasked
    h_sorted = torch.tensor([[0.0, 0.25, 0.5, 1.0, 0.0],
                             [0.5, 0.5, 2.0, 0.0, 0.0]])
    masked_sorted = torch.tensor([[True, True, True, True, False],
                                  [True, True, True, False, False]])
    # row 0: sums ahead of each slot 0, 0, 0.25, 0.75; row 1: 0, 0.5, 1.0
    expected = {0.0: [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]],
                0.25: [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]],
                0.75: [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]],
                1.0: [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]],
                100.0: [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]}
    for gamma, accept in expected.items():
        got = sampling.entropy_bound(h_sorted, masked_sorted, gamma)
        assert got.dtype == torch.bool and got.int().tolist() == accept, f"γ = {gamma}"


def by_hand_left(probs, masked, gamma):
    """The bound of Eq. 18 with the masked positions in position order: largest s with
    H_(1)+..+H_(s) - max(H_(1)..H_(s)) <= γ."""
    h = [entropy_of(p) for p in probs]
    order = [i for i in range(len(h)) if masked[i]]
    first = lambda s: [h[i] for i in order[:s]]  # noqa: E731
    return reveal_largest_prefix(order, lambda s: sum(first(s)) - max(first(s)) <= gamma)


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.3, 1.0, 3.0, 1e9])
def test_left_rule_matches_by_hand(threshold):
    """reveal_left reveals a prefix of the masked positions in position order (exact sampling
    needs it: docs/method.md, "Why the reveal order must be left to right")."""
    for seed in range(3):
        probs, is_masked = random_block(seed=seed)
        reveal = sampling.reveal_left(probs, is_masked, threshold)
        assert reveal.dtype == torch.bool and reveal.shape == is_masked.shape
        for b in range(probs.size(0)):
            expected = by_hand_left(probs[b].tolist(), is_masked[b].tolist(), threshold)
            got = set(torch.nonzero(reveal[b]).flatten().tolist())
            assert got == expected, f"γ = {threshold}, row {b}: {sorted(got)} != {sorted(expected)}"
