"""
Exact SBD for serving: batches whose rows keep different numbers of drafts, sampling at temperature
> 0 with speculative sampling's acceptance rule, and the adaptive block size.

Correctness is checked against independent definitions: each row decoded alone by NTP (batches),
the distribution of NTP sampling enumerated over every short output (sampling), and a chi-square
bound that a wrong acceptance rule fails (the test shows that it fails).
"""

import itertools
import math

import pytest
import torch
from test_exact import ScriptedDrafts
from torch.nn import functional as F

import decode
import sampling
import tiny_models
from pretrained.shapes import build_model
from sampling import DecodeSettings
from serving import batched, exact
from serving.settings import ServingSettings

FAMILIES = ["gpt-tiny", "llama-tiny"]


def random_model(family, seed=0):
    return tiny_models.random_model(family, seed, std=0.5, dtype=torch.float64)


def mask_id_of(m):
    return m.config.vocab_size - 1


def prompts_and_stop(m, B, seed, T0=5):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, m.config.vocab_size - 1, (B, T0), generator=g)
    stop = int(torch.randint(0, m.config.vocab_size - 1, (1,), generator=g))
    return prompts, stop

# -----------------------------------------------------------------------------
# batches: every row is NTP's, whatever the other rows do


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k, gamma, adaptive, floor", [
    (4, 0.0, False, 0.0), (8, 0.5, False, 0.0), (16, 1e9, False, 0.0), (16, 0.5, True, 0.0),
    (8, 1e9, True, 0.0), (16, 1e9, False, 0.3), (8, 0.5, False, 0.3)])
def test_batch_rows_equal_ntp_of_each_row_alone(family, k, gamma, adaptive, floor):
    m = random_model(family)
    prompts, stop = prompts_and_stop(m, 6, seed=k)
    settings = ServingSettings(mask_id=mask_id_of(m), k=k, gamma=gamma, stop_ids=[stop], exact=True,
                              adaptive=adaptive, min_draft_prob=floor)
    out, stats = exact.exact_generate(m, prompts, settings, 30)
    for b in range(6):
        alone, _ = tiny_models.ntp(m, prompts[b:b + 1], 30, [stop], mask_id=mask_id_of(m))
        assert out[b] == alone[0], f"row {b}"
        one, one_stats = exact.exact_generate(m, prompts[b:b + 1], settings, 30)
        assert one == [out[b]]
        # float64: a row alone and in a batch make the same reveal decisions, so the same counts
        for name in ("nfe", "tokens", "accepted", "rejected", "final_checks", "unchecked"):
            assert getattr(stats, name)[b] == getattr(one_stats, name)[0], f"row {b}: {name}"
    assert sum(stats.rejected) > 10, "random drafts must be rejected, or this checks nothing"
    assert (sum(stats.unchecked) > 10) == (floor > 0), "a floor must cut drafts, none without"


def test_rows_that_end_early_leave_the_batch_alone():
    """One row stops at once (its first token is the stop token), the others decode to the end."""
    m = random_model("gpt-tiny")
    prompts, _ = prompts_and_stop(m, 4, seed=3)
    first, _ = tiny_models.ntp(m, prompts[:1], 1)
    stop = first[0][0]
    settings = DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9, stop_ids=[stop], exact=True)
    out, stats = exact.exact_generate(m, prompts, settings, 20)
    ntp, _ = tiny_models.ntp(m, prompts, 20, [stop], mask_id=mask_id_of(m))
    assert out == ntp and out[0] == [stop] and stats.nfe[0] == 1


def test_cache_mask_is_the_hybrid_mask_without_the_padding():
    """A row with 2 pending tokens and a 3-slot block in a forward padded to 8, on a cache of 2:
    the mask drawn by hand (rows: the 8 new tokens at slots 2-9; columns: cache slots 0-11, the
    static cache's whole buffer: slots 10-11 hold nothing of this forward)."""
    q = torch.arange(2, 10)[:, None]
    kv = torch.arange(12)[None, :]
    mask = batched.cache_mask(q, kv, block_start=2 + 2, end=2 + 5)
    #           cache | p0 p1 | b0 b1 b2 | pad pad pad | unused
    by_hand = [[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # p0: causal
               [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # p1
               [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],  # b0..b2: the prefix and the whole block
               [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
               [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
               [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # padding: what the block sees, and itself
               [1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0],
               [1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0]]
    assert mask.int().tolist() == by_hand


# -----------------------------------------------------------------------------
# sampling: speculative sampling's rule makes the output distributed as NTP sampling's


def test_acceptance_rule_on_scripted_p_and_q():
    """One draft x ~ q, kept with probability min(1, p(x)/q(x)), else a draw from
    norm(max(0, p - q)): the emitted token is distributed as p. 200k rows at once."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.6, 0.1, 0.2], dtype=torch.float64)
    N, g = 200_000, torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q.expand(N, 4), 1, replacement=True, generator=g)  # (N, 1)
    ok, targets = decode.accept_sampled(drafts, q.expand(N, 1, 4), p.expand(N, 2, 4), g)
    emitted = torch.where(ok[:, 0], drafts[:, 0], targets[:, 0])
    assert chi_square(torch.bincount(emitted, minlength=4), p) < chi_square_bound(3)
    accept = (p / q).clamp(max=1).float()  # P(keep | x) = min(1, p(x) / q(x))
    kept_rate = torch.bincount(drafts[ok], minlength=4) / torch.bincount(drafts[:, 0], minlength=4)
    assert torch.allclose(kept_rate, accept, atol=0.01)
    residual = (p - q).clamp(min=0) / (p - q).clamp(min=0).sum()
    resampled = torch.bincount(targets[~ok[:, 0], 0], minlength=4)
    assert chi_square(resampled, residual) < chi_square_bound(3)
    assert chi_square(torch.bincount(targets[:, 1], minlength=4), p) < chi_square_bound(3)


def chi_square(counts, probs):
    """Pearson's statistic of observed counts against expected probabilities (cells with p > 0)."""
    counts = counts.double()
    expected = probs.double() * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def chi_square_bound(dof):
    """A threshold the statistic exceeds with probability ~1e-6 under the right distribution
    (Wilson-Hilferty approximation), so that a correct sampler never fails by chance."""
    z = 4.75
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def tiny_sampling_model(seed=2, std=0.7):
    """A GPT with 5 tokens and a mask token, far from uniform, so that its masked-token
    distribution q differs a lot from its next-token distribution p."""
    torch.manual_seed(seed)
    m = build_model("gpt", n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=6)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return m.double().eval()


@torch.no_grad()
def enumerate_ntp(m, prompt, n, mask_id, temperature=1.0, top_k=None):
    """{output tuple: probability} of NTP sampling n tokens, every output enumerated."""
    V, probs = m.config.vocab_size, {}
    for out in itertools.product([v for v in range(V) if v != mask_id], repeat=n):
        idx = torch.tensor([prompt + list(out)])
        logits, _ = m(idx)
        logits[..., mask_id] = float("-inf")
        logits = logits[0, len(prompt) - 1:-1] / temperature  # (n, V): the steps' next tokens
        if top_k is not None:  # by hand: all but the top_k largest logits out
            logits[logits < torch.topk(logits, top_k, dim=-1).values[:, -1:]] = float("-inf")
        p = F.softmax(logits, dim=-1)
        probs[out] = float(torch.prod(p[torch.arange(n), torch.tensor(out)]))
    return probs


def sampled_histogram(m, prompt, n, settings, rows=4000, calls=5):
    counts = {}
    g = torch.Generator().manual_seed(1)
    for _ in range(calls):
        out, _ = exact.exact_generate(m, torch.tensor([prompt] * rows), settings, n, generator=g)
        for row in out:
            counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts


def statistic(counts, probs, min_expected=5):
    """-> (chi-square statistic, degrees of freedom) of sampled outputs against enumerated
    probabilities. Outputs expected fewer than min_expected times are pooled into one cell, where
    the chi-square approximation holds; an output of probability 0 must never be drawn."""
    n = sum(counts.values())
    assert set(counts) <= {o for o, p in probs.items() if p > 0}, "an impossible output was drawn"
    big = [o for o in probs if probs[o] * n >= min_expected]
    small = [o for o in probs if o not in big]
    observed = [counts.get(o, 0) for o in big] + [sum(counts.get(o, 0) for o in small)]
    expected = [probs[o] for o in big] + [sum(probs[o] for o in small)]
    return chi_square(torch.tensor(observed), torch.tensor(expected)), len(big)


@pytest.mark.parametrize("top_k, floor", [(None, 0.0), (3, 0.0), (None, 0.6)])
def test_exact_sampling_is_distributed_as_ntp_sampling(top_k, floor):
    """3 tokens from a 5-token model: 125 outputs, their NTP probabilities enumerated; 20k exact
    decodes at k=3 (two drafts per block) must fit them within the chi-square bound. A floor on
    the drafts' head probability (min_draft_prob) cuts blocks and must keep the distribution."""
    m = tiny_sampling_model()
    prompt, n = [1, 2, 3], 3
    settings = ServingSettings(mask_id=5, k=3, gamma=1e9, rule="left", exact=True, temperature=1.0,
                              top_k=top_k, min_draft_prob=floor)
    if floor:  # the first block's drafts (head probability 0.48, 0.52) are cut; the second
        # block's one draft (0.49-0.85, after a drawn token) is checked in some rows only
        _, stats = exact.exact_generate(m, torch.tensor([prompt] * 200), settings, n)
        assert sum(stats.unchecked) > 400 and sum(stats.accepted) + sum(stats.rejected) > 0
    probs = enumerate_ntp(m, prompt, n, 5, top_k=top_k)
    value, dof = statistic(sampled_histogram(m, prompt, n, settings), probs)
    assert dof >= 10 and value < chi_square_bound(dof)


RIGHT_RULE = decode.accept_sampled


def always_keep(drafts, q, p, generator=None):  # a wrong rule: every draft survives
    ok, targets = RIGHT_RULE(drafts, q, p, generator)
    return torch.ones_like(ok), targets


def resample_from_p(drafts, q, p, generator=None):  # a wrong rule: the correction ignores q
    ok, _ = RIGHT_RULE(drafts, q, p, generator)
    return ok, sampling.sample(p, generator)


@pytest.mark.parametrize("wrong_rule", [always_keep, resample_from_p])
def test_a_wrong_acceptance_rule_fails_the_same_check(monkeypatch, wrong_rule):
    m = tiny_sampling_model()
    prompt, n = [1, 2, 3], 3
    settings = DecodeSettings(mask_id=5, k=3, gamma=1e9, rule="left", exact=True, temperature=1.0)
    probs = enumerate_ntp(m, prompt, n, 5)
    monkeypatch.setattr(decode, "accept_sampled", wrong_rule)
    value, dof = statistic(sampled_histogram(m, prompt, n, settings), probs)
    assert value > 3 * chi_square_bound(dof)


# -----------------------------------------------------------------------------
# the adaptive block size


def test_block_size_rule_by_hand():
    K = 16
    assert exact.next_block_size(16, 15, 15, 1, 0, K) == (16, 1, 0)  # all kept: stays at K
    assert exact.next_block_size(4, 3, 3, 4, 0, K) == (8, 1, 0)  # all kept: 2x, patience resets
    assert exact.next_block_size(16, 15, 6, 1, 0, K) == (16, 1, 0)  # some survived: k stays
    assert exact.next_block_size(8, 7, 1, 4, 0, K) == (8, 4, 0)
    assert exact.next_block_size(2, 1, 0, 2, 0, K) == (1, 8, 2)  # nothing survived: NTP, wait 2
    assert exact.next_block_size(16, 15, 0, 16, 0, K) == (1, 64, 16)  # patience: 4x, at most 64
    assert exact.next_block_size(1, 0, 0, 4, 2, K) == (1, 4, 1)  # waiting at k = 1
    assert exact.next_block_size(1, 0, 0, 4, 1, K) == (2, 4, 0)  # then tries 2 drafts' worth again


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1e9])
def test_adaptive_exact_never_costs_much_more_than_ntp(family, gamma):
    """Random models draft almost always wrong. With adaptation each row spends at most its first
    block's forwards beyond NTP's one forward per token; without it, γ = 0 pays for every block."""
    K = 16
    for seed in range(3):
        m = random_model(family, seed)
        prompts, _ = prompts_and_stop(m, 4, seed)
        settings = ServingSettings(mask_id=mask_id_of(m), k=K, gamma=gamma, exact=True,
                                  adaptive=True)
        out, stats = exact.exact_generate(m, prompts, settings, 48)
        ntp, ntp_stats = tiny_models.ntp(m, prompts, 48, mask_id=mask_id_of(m))
        assert out == ntp
        for b in range(4):
            assert stats.nfe[b] <= ntp_stats.nfe[b] + K, f"seed {seed} row {b}"
    plain = DecodeSettings(mask_id=mask_id_of(m), k=K, gamma=0.0, exact=True)
    _, plain_stats = exact.exact_generate(m, prompts, plain, 48)
    if gamma == 0.0:  # the bound is adaptation's doing
        assert max(n - t for n, t in zip(plain_stats.nfe, ntp_stats.nfe)) > K


# -----------------------------------------------------------------------------
# the host-list path (greedy, whole blocks drafted in one forward) against the tensor path


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("B", [1, 4])
def test_host_path_equals_tensor_path(family, B, monkeypatch):
    """Greedy drafts of whole blocks (γ = ONE_FORWARD, or adaptive) keep each row's state in host
    lists; tensor_state=True runs the general tensor path instead. Tokens and every count must be
    the same, through accepts, rejections, stop tokens, the budget and adaptive rows' NTP loop."""

    class TensorRows(exact.Rows):
        def __init__(self, *args, tensor_state=False):
            super().__init__(*args, tensor_state=True)

    cases = []  # (model, prompts, stop); at batch 1 also drafts right but at one position
    for seed in range(3):
        m = random_model(family, seed)
        cases.append((m, *prompts_and_stop(m, B, seed)))
        if B == 1:
            ntp, _ = tiny_models.ntp(m, cases[-1][1], 40, mask_id=mask_id_of(m))
            script = cases[-1][1][0].tolist() + ntp[0] + [0] * 40
            cases.append((ScriptedDrafts(m, script, wrong_at=9 + 6 * seed), *cases[-1][1:]))
    accepted = rejected = 0
    for m, prompts, stop in cases:
        for k, adaptive, stop_ids, n, floor in itertools.product(
                (1, 4, 16), (False, True), ((), (stop,)), (7, 40), (0.0, 0.3)):
            settings = ServingSettings(mask_id=mask_id_of(m), k=k, gamma=sampling.ONE_FORWARD,
                                      stop_ids=stop_ids, exact=True, adaptive=adaptive,
                                      min_draft_prob=floor)
            assert exact.Rows(prompts, settings, n, m.config.vocab_size).on_host
            host, host_stats = exact.exact_generate(m, prompts, settings, n)
            with monkeypatch.context() as patch:
                patch.setattr(exact, "Rows", TensorRows)
                general, stats = exact.exact_generate(m, prompts, settings, n)
            assert host == general, (k, adaptive, stop_ids, n)
            for name in ("nfe", "tokens", "widths", "accepted", "rejected", "wasted_forwards",
                         "final_checks", "unchecked"):
                assert getattr(host_stats, name) == getattr(stats, name), (name, k, n)
            accepted, rejected = accepted + sum(stats.accepted), rejected + sum(stats.rejected)
    assert accepted > 0 and rejected > 0  # both branches of the check ran
