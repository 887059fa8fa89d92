"""
Assignment 4 (reveal rules), checks beyond test_samplers.py: entropy of distributions whose
entropy is known exactly (a one-hot row is 0, not nan: 0 * log 0 counts as 0), and the entropy bound
of Eq. 8 on sorted entropies written with binary fractions, so that every sum is exact and no
comparison depends on rounding; and the left-to-right rule (reveal_left) by its properties (a
prefix of the masked positions in position order; γ = 0 and a huge γ). The rule written out per
row is a hidden test (tests/hidden/test_hidden_reveal_rules.py).
"""

import math

import torch
from test_samplers import random_block

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


def test_left_rule_reveals_a_prefix_in_position_order():
    """reveal_left reveals the first s masked positions, left to right (exact sampling needs it:
    docs/method.md, "Why the reveal order must be left to right"): at least one, all at a huge γ,
    only the first at γ = 0, and more as γ grows."""
    probs, is_masked = random_block(B=16, seed=9)
    counts = []
    for gamma in (0.0, 0.3, 1.0, 3.0, 1e9):
        reveal = sampling.reveal_left(probs, is_masked, gamma)
        assert reveal.dtype == torch.bool and reveal.shape == is_masked.shape
        assert not (reveal & ~is_masked).any(), "only masked positions are revealed"
        # among the masked positions of a row, the revealed ones come first
        rank = is_masked.long().cumsum(dim=1)  # (B, k): 1 for the first masked position, ...
        n = reveal.sum(dim=1, keepdim=True)
        assert torch.equal(reveal, is_masked & (rank <= n)), f"γ = {gamma}: not a prefix"
        assert (n[is_masked.any(dim=1)] >= 1).all(), "a row with masks reveals at least one"
        counts.append(n)
    assert torch.equal(counts[0], is_masked.any(dim=1, keepdim=True).long())
    assert torch.equal(counts[-1], is_masked.sum(dim=1, keepdim=True))
    assert all((a <= b).all() for a, b in zip(counts, counts[1:])), "more γ, never fewer"
    assert len({int(c.sum()) for c in counts}) >= 4, "the γs in between vary the count"
