"""
Assignment 3 (the KV cache), KVCache.extend on its own, with exact equality (it only moves
numbers): what it returns, what it commits, what it must leave alone, and a clear error when the
cache is full. The rest of the grading (test_model.py, test_decoding.py) checks cached forwards
against uncached ones.

Only the committed slots [0, length) are part of the contract: an implementation may also use the
buffer past the length as scratch space for the uncommitted block (the next forward overwrites it)
or not.
"""

import pytest
import torch

from model import KVCache

B, H, HD = 2, 3, 4  # batch, K/V heads, head_dim


def new(T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, HD, generator=g), torch.randn(B, H, T, HD, generator=g)


def forward_like(cache, T, n_commit, seed):
    """What a model's forward does with the cache: extend every layer, then advance the length."""
    k_new, v_new = new(T, seed)
    out = [cache.extend(layer, k_new + layer, v_new - layer, n_commit) for layer in range(2)]
    cache.length += n_commit
    return k_new, v_new, out


def test_extend_writes_only_the_committed_tokens():
    cache = KVCache(2, B, H, HD, max_len=16, device="cpu", dtype=torch.float32)
    k0, v0, _ = forward_like(cache, 5, 5, seed=0)  # a prefill: 5 tokens, all committed
    assert cache.length == 5
    committed = [(cache.k[layer][:, :, :5].clone(), cache.v[layer][:, :, :5].clone())
                 for layer in range(2)]
    assert torch.equal(committed[0][0], k0) and torch.equal(committed[1][1], v0 - 1)

    k1, v1, out = forward_like(cache, 6, 2, seed=1)  # [2 committed ; a block of 4 that is not]
    assert cache.length == 7, (
        "extend must not move the length: forward() does, once, after every layer")
    for layer, (k_all, v_all) in enumerate(out):
        assert k_all.shape == v_all.shape == (B, H, 5 + 6, HD)  # [5 cached ; 6 new]
        assert torch.equal(k_all, torch.cat([committed[layer][0], k1 + layer], dim=2))
        assert torch.equal(v_all, torch.cat([committed[layer][1], v1 - layer], dim=2))
        assert torch.equal(cache.k[layer][:, :, :5], committed[layer][0]), "an old slot changed"
        assert torch.equal(cache.k[layer][:, :, 5:7], k1[:, :, :2] + layer), (
            "the committed tokens were not kept")
        assert torch.equal(cache.v[layer][:, :, 5:7], v1[:, :, :2] - layer)

    # a block alone on top of the cache: nothing committed
    k2, _, out = forward_like(cache, 3, 0, seed=2)
    assert cache.length == 7
    assert torch.equal(out[0][0], torch.cat([committed[0][0], k1[:, :, :2], k2], dim=2))


def test_a_full_cache_is_a_clear_error_and_stays_unchanged():
    cache = KVCache(2, B, H, HD, max_len=8, device="cpu", dtype=torch.float32)
    forward_like(cache, 6, 6, seed=0)
    forward_like(cache, 2, 1, seed=1)  # 6 + 2 = 8 slots: fits exactly
    assert cache.length == 7
    before = [t[:, :, :7].clone() for t in cache.k + cache.v]
    with pytest.raises(ValueError):
        cache.extend(0, *new(3, seed=2), n_commit=3)  # 7 + 3 > 8
    assert cache.length == 7
    assert all(torch.equal(t[:, :, :7], b) for t, b in zip(cache.k + cache.v, before))
