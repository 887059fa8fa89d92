"""
The reveal rules and the token choice of sampling.py, by their properties (the extremes of γ and f,
ties, one mask or none, rows independent of each other) and on distributions worked out by hand.
The rules written out again as per-row loops are hidden tests
(tests/hidden/test_hidden_reveal_rules.py): called row by row they would pass for assignment 4's
solution.
"""


import pytest
import torch

import sampling

# -----------------------------------------------------------------------------
# inputs


def test_confidence_rule_subtracts_the_largest_entropy():
    """Eq. 18 by hand: confidences 0.9 > 0.8 > 0.7 with entropies 0.2, 0.9, 0.4. At s = 3 the sum
    1.5 minus its largest term 0.9 is 0.6: revealed at γ = 0.6. Subtracting the third entropy
    (0.4) instead would leave 1.1 and stop at two."""
    h, c = torch.tensor([0.2, 0.9, 0.4]), torch.tensor([0.9, 0.8, 0.7])
    order = torch.argsort(-c)
    masked = torch.ones(1, 3, dtype=torch.bool)
    assert sampling.entropy_bound(h[order][None], masked, 0.6).tolist() == [[True] * 3]
    assert sampling.entropy_bound(h[order][None], masked, 0.59).tolist() == [[True, True, False]]


def random_block(B=6, k=8, V=11, seed=0, p_masked=0.7):
    """Probabilities (B, k, V) with entropies spread from near 0 to near log V, and a random
    mask."""
    g = torch.Generator().manual_seed(seed)
    sharpness = torch.rand(B, k, 1, generator=g, dtype=torch.float64) * 6  # 0: flat, 6: peaked
    logits = torch.randn(B, k, V, generator=g, dtype=torch.float64) * sharpness
    probs = torch.softmax(logits, dim=-1)
    is_masked = torch.rand(B, k, generator=g) < p_masked
    return probs, is_masked


RULES = ["entropy", "confidence", "factor"]

# -----------------------------------------------------------------------------
# the rules by their properties


@pytest.mark.parametrize("rule", ["entropy", "confidence"])
def test_gamma_zero_reveals_one_and_huge_gamma_all(rule):
    probs, is_masked = random_block(seed=4)
    has_mask = is_masked.any(dim=1)
    one = sampling.REVEAL_RULES[rule](probs, is_masked, 0.0)
    assert (one.sum(dim=1) == has_mask.long()).all()
    everything = sampling.REVEAL_RULES[rule](probs, is_masked, 1e9)
    assert torch.equal(everything, is_masked)


@pytest.mark.parametrize("rule", sorted(sampling.REVEAL_RULES))
def test_one_forward_reveals_what_every_rule_reveals(rule):
    """reveal_step skips the probabilities at γ = ONE_FORWARD: each rule, run on them, reveals
    the same slots, even for the flattest distributions (uniform over a large vocabulary)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.cat([torch.randn(2, 16, 5000, generator=g), torch.zeros(1, 16, 5000)])
    is_masked = torch.rand(3, 16, generator=g) < 0.7
    settings = sampling.DecodeSettings(mask_id=None, k=16, gamma=sampling.ONE_FORWARD, rule=rule)
    block, revealed, _ = sampling.reveal_step(logits, torch.zeros(3, 16, dtype=torch.long),
                                           is_masked, settings)
    by_rule = sampling.REVEAL_RULES[rule](logits.softmax(-1), is_masked, sampling.ONE_FORWARD)
    assert torch.equal(revealed, by_rule) and torch.equal(revealed, is_masked)
    assert torch.equal(block[revealed], logits.argmax(-1)[revealed])


def test_factor_extremes():
    """f <= 0 reveals only the most confident position; f > k + 1 reveals all (1 - c <= 1)."""
    probs, is_masked = random_block(seed=5)
    one = sampling.reveal_factor(probs, is_masked, 0.0)
    assert (one.sum(dim=1) == is_masked.any(dim=1).long()).all()
    conf = probs.amax(-1).masked_fill(~is_masked, -1)
    rows = is_masked.any(dim=1)
    assert torch.equal(one[rows].float().argmax(dim=1), conf[rows].argmax(dim=1))
    assert torch.equal(sampling.reveal_factor(probs, is_masked, probs.size(1) + 2.0), is_masked)


def test_factor_rule_is_one_minus_confidence():
    """Two positions of confidence 0.9: (2+1)(1-0.9) = 0.3 < f = 0.5 reveals both;
    docs/method.md's (n+1)·c_(n) = 2.7 would not. One position of 0.6 after them:
    (3+1)(1-0.6) = 1.6 >= 0.5 stops it."""
    V = 4
    rows = [[0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3], [0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3],
            [0.6, 0.2, 0.1, 0.1]]
    probs = torch.tensor([rows], dtype=torch.float64)  # (1, 3, V)
    assert probs.shape == (1, 3, V)
    reveal = sampling.reveal_factor(probs, torch.ones(1, 3, dtype=torch.bool), 0.5)
    assert reveal.tolist() == [[True, True, False]]


@pytest.mark.parametrize("rule", RULES)
def test_ties_keep_lower_position_first(rule):
    """Identical distributions everywhere: the rule that reveals one picks the lowest masked
    position."""
    k, V = 6, 5
    logits = torch.tensor([3.0, 1.0, 0.0, 0.0, -1.0], dtype=torch.float64)
    probs = torch.softmax(logits, 0).expand(2, k, V)
    is_masked = torch.tensor([[False, True, True, True, False, True], [True] * k])
    reveal = sampling.REVEAL_RULES[rule](probs, is_masked, 0.0)
    assert reveal.tolist() == [[False, True, False, False, False, False],
                               [True] + [False] * (k - 1)]


@pytest.mark.parametrize("rule", RULES)
def test_single_mask_and_no_mask(rule):
    probs, _ = random_block(B=3, k=5, seed=6)
    is_masked = torch.tensor([[False, False, True, False, False], [False] * 5,
                              [True] + [False] * 4])
    reveal = sampling.REVEAL_RULES[rule](probs, is_masked, 0.0)
    assert torch.equal(reveal, is_masked), "a single mask is always revealed; no mask, nothing"


@pytest.mark.parametrize("rule", RULES)
def test_batch_rows_are_independent(rule):
    """A row's reveal does not depend on the other rows of the batch."""
    probs, is_masked = random_block(B=5, seed=7)
    together = sampling.REVEAL_RULES[rule](probs, is_masked, 1.0)
    for b in range(5):
        alone = sampling.REVEAL_RULES[rule](probs[b:b + 1], is_masked[b:b + 1], 1.0)
        assert torch.equal(alone[0], together[b])


# -----------------------------------------------------------------------------
# token choice


def settings(**fields):
    """Settings that only choose tokens (mask_id None: nothing suppressed)."""
    return sampling.DecodeSettings(mask_id=fields.pop("mask_id", None), **fields)


def test_mask_token_is_never_chosen():
    logits = torch.randn(4, 3, 10)
    logits[..., 7] = 100.0  # the mask token would win everything
    suppressed = sampling.suppress_mask(logits, 7)
    assert logits[0, 0, 7] == 100.0, "suppress_mask must not modify its input"
    assert not (sampling.next_token(logits, settings(mask_id=7)) == 7).any()
    g = torch.Generator().manual_seed(0)
    sampled = sampling.next_token(logits, settings(mask_id=7, temperature=1.0), g)
    assert not (sampled == 7).any() and torch.equal(suppressed[..., :7], logits[..., :7])


def test_greedy_and_top_k():
    logits = torch.randn(8, 5, 30)
    assert torch.equal(sampling.next_token(logits, settings()), logits.argmax(-1))
    g = torch.Generator().manual_seed(0)
    top1 = sampling.next_token(logits, settings(temperature=2.0, top_k=1), g)
    assert torch.equal(top1, logits.argmax(-1))
    top3 = torch.topk(logits, 3, dim=-1).indices  # (8, 5, 3)
    for _ in range(5):
        drawn = sampling.next_token(logits, settings(temperature=1.5, top_k=3), g)  # (8, 5)
        assert (drawn[..., None] == top3).any(-1).all(), "top_k=3 drew a token outside the top 3"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_is_argmax_with_ties_to_the_lowest_id(dtype):
    """greedy (max's indices) == argmax, by hand on ties and -inf, and on rows full of ties."""
    row = torch.tensor([float("-inf"), 2.0, 5.0, 1.0, 5.0, 5.0, float("-inf")], dtype=dtype)
    assert sampling.greedy(row).item() == 2
    assert sampling.greedy(torch.full((3, 7), float("-inf"), dtype=dtype)).tolist() == [0] * 3
    g = torch.Generator().manual_seed(0)
    for V in (7, 256, 49152):  # small integers: many rows hold their maximum more than once
        logits = torch.randint(0, 4, (3, 17, V), generator=g).to(dtype)
        assert torch.equal(sampling.greedy(logits), logits.argmax(-1)), V

def test_sampling_follows_the_generator():
    logits = torch.randn(2, 4, 30)
    a = sampling.next_token(logits, settings(temperature=1.0), torch.Generator().manual_seed(1))
    b = sampling.next_token(logits, settings(temperature=1.0), torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_block_sampler_reveals_on_the_temperature_one_distribution():
    """Sampling temperature changes the tokens, not which positions the rule reveals."""
    logits = torch.randn(3, 6, 20) * 3
    block = torch.full((3, 6), 19)
    is_masked = torch.ones(3, 6, dtype=torch.bool)
    greedy = sampling.DecodeSettings(mask_id=19, gamma=0.5)
    hot = greedy.replace(temperature=5.0)
    _, revealed_greedy, _ = sampling.reveal_step(logits, block, is_masked, greedy)
    new_block, revealed_hot, _ = sampling.reveal_step(logits, block, is_masked, hot,
                                                      torch.Generator().manual_seed(0))
    assert torch.equal(revealed_greedy, revealed_hot)
    assert not (new_block[revealed_hot] == 19).any()
    assert (new_block[~revealed_hot] == 19).all(), "unrevealed positions stay masked"
