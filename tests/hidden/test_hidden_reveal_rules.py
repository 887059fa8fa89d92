"""
Hidden (the grader's): the reveal rules of sampling.py (assignment 4) against each rule written out
again by hand, a plain per-row Python loop over sorted lists, slow but obviously the rule in the
paper. Called row by row, these would pass for the rules themselves, so they stay out of a handout;
tests/test_samplers.py and tests/test_assignment_4.py check the rules by their properties and on
inputs worked out by hand.
"""

import math

import pytest
import torch
from test_samplers import RULES, random_block

import sampling

# -----------------------------------------------------------------------------
# the rules, written out independently, one row at a time


def by_hand_entropy(probs, masked, gamma):
    """EB-Sampler Eq. 8: entropy ascending (ties: lower position); largest s with
    H_(1)+..+H_(s-1) <= γ."""
    h = [entropy_of(p) for p in probs]
    order = sorted((i for i in range(len(h)) if masked[i]), key=lambda i: (h[i], i))
    return reveal_largest_prefix(order, lambda s: sum(h[i] for i in order[:s - 1]) <= gamma)


def by_hand_confidence(probs, masked, gamma):
    """EB-Sampler Eq. 18: confidence descending (ties: lower position); largest s with
    H_(1)+..+H_(s) - max(H_(1)..H_(s)) <= γ, entropies in that order."""
    h = [entropy_of(p) for p in probs]
    c = [max(p) for p in probs]
    order = sorted((i for i in range(len(c)) if masked[i]), key=lambda i: (-c[i], i))
    first = lambda s: [h[i] for i in order[:s]]  # noqa: E731
    return reveal_largest_prefix(order, lambda s: sum(first(s)) - max(first(s)) <= gamma)


def by_hand_factor(probs, masked, f):
    """Fast-dLLM: confidence descending; largest n with (n + 1) * (1 - c_(n)) < f, at least one."""
    c = [max(p) for p in probs]
    order = sorted((i for i in range(len(c)) if masked[i]), key=lambda i: (-c[i], i))
    return reveal_largest_prefix(order, lambda n: n == 1 or (n + 1) * (1 - c[order[n - 1]]) < f)


def entropy_of(p):
    return -sum(x * math.log(x) for x in p if x > 0)


def reveal_largest_prefix(order, ok):
    """Reveal order[:s] for the largest s in 1..len(order) with ok(s); nothing if order is empty."""
    best = max((s for s in range(1, len(order) + 1) if ok(s)), default=0)
    revealed = set(order[:best])
    return revealed


BY_HAND = {"entropy": by_hand_entropy, "confidence": by_hand_confidence, "factor": by_hand_factor}


def check_against_by_hand(rule, probs, is_masked, threshold):
    """Run sampling's vectorised rule on the batch and the by-hand rule row by row; they must
    agree."""
    reveal = sampling.REVEAL_RULES[rule](probs, is_masked, threshold)  # (B, k)
    assert reveal.dtype == torch.bool and reveal.shape == is_masked.shape
    for b in range(probs.size(0)):
        expected = BY_HAND[rule](probs[b].tolist(), is_masked[b].tolist(), threshold)
        got = set(torch.nonzero(reveal[b]).flatten().tolist())
        assert got == expected, (
            f"rule {rule}, row {b}: revealed {sorted(got)}, by hand {sorted(expected)}")
    return reveal


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.3, 1.0, 3.0, 1e9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rule_matches_by_hand(rule, threshold, seed):
    probs, is_masked = random_block(seed=seed)
    reveal = check_against_by_hand(rule, probs, is_masked, threshold)
    assert not (reveal & ~is_masked).any(), "an unmasked position was revealed"
    has_mask = is_masked.any(dim=1)
    assert (reveal.sum(dim=1)[has_mask] >= 1).all(), "a row with masks revealed nothing"


@pytest.mark.parametrize("rule", RULES)
def test_thresholds_in_between_vary_the_count(rule):
    """The by-hand comparison means something: between the extremes, rows reveal different
    counts."""
    probs, is_masked = random_block(B=32, seed=3, p_masked=1.0)
    threshold = {"entropy": 1.0, "confidence": 1.0, "factor": 1.0}[rule]
    reveal = check_against_by_hand(rule, probs, is_masked, threshold)
    assert len(set(reveal.sum(dim=1).tolist())) >= 3


@pytest.mark.parametrize("rule", RULES)
def test_rules_take_float32(rule):
    """The decoder feeds float32 probabilities; the rule's result is the by-hand one on them."""
    probs, is_masked = random_block(seed=8)
    check_against_by_hand(rule, probs.float(), is_masked, 0.7)


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
