"""
Assignment 3 (the KV cache), KVCache.extend on its own, with exact equality (it only moves
numbers): where it writes, what it returns, what it must leave alone, rows of different lengths,
and a clear error when the cache is full. The rest of the grading (test_model.py, test_decoding.py)
checks cached forwards against uncached ones.

The cache is static: extend writes all T new tokens at each row's slots [length, length + T) and
returns the whole buffers; the slots past the committed length are scratch (the next forward
overwrites them), and the mask hides them.
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
    cache.commit(n_commit)
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
        assert k_all.shape == v_all.shape == (B, H, 16, HD), "the whole buffers, read whole"
        assert torch.equal(k_all[:, :, :11], torch.cat([committed[layer][0], k1 + layer], dim=2))
        assert torch.equal(v_all[:, :, :11], torch.cat([committed[layer][1], v1 - layer], dim=2))
        assert torch.equal(cache.k[layer][:, :, :5], committed[layer][0]), "an old slot changed"
        assert torch.equal(cache.k[layer][:, :, 5:7], k1[:, :, :2] + layer), (
            "the committed tokens were not kept")
        assert torch.equal(cache.v[layer][:, :, 5:7], v1[:, :, :2] - layer)

    # a block alone on top of the cache: nothing committed
    k2, _, out = forward_like(cache, 3, 0, seed=2)
    assert cache.length == 7
    assert torch.equal(out[0][0][:, :, :10], torch.cat([committed[0][0], k1[:, :, :2], k2], dim=2))


def test_each_row_is_written_after_its_own_length():
    cache = KVCache(1, B, H, HD, max_len=8, device="cpu", dtype=torch.float32)
    cache.lengths = torch.tensor([5, 2])  # rows of different lengths (exact SBD's)
    before = cache.k[0].clone()
    k_new, v_new = new(3, seed=3)
    cache.extend(0, k_new, v_new, n_commit=1)
    assert torch.equal(cache.k[0][0, :, 5:8], k_new[0])
    assert torch.equal(cache.v[0][1, :, 2:5], v_new[1])
    assert torch.equal(cache.k[0][0, :, :5], before[0, :, :5]), "row 0's committed slots changed"
    assert torch.equal(cache.k[0][1, :, :2], before[1, :, :2]), "row 1's committed slots changed"


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
