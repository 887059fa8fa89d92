"""
model.py checked against definitions written out independently here: an uncached full forward for
the KV cache, hand-written 0/1 matrices for the masks, docs/llama.md's rules for RoPE, GQA and the
8B shapes.

Tiny random models in float32; cached and uncached logits must agree to 1e-5 (they do to ~3e-6).
Weights are drawn with std 0.1, five times the training init, so that attention is far from uniform
and a wrong mask, position or cache entry moves the logits by 0.1 or more, far beyond the tolerance.
"""


import pytest
import torch

import checkpoint as checkpoint_lib
import model as model_lib
import sbd
from model import LlamaConfig, dense_mask
from pretrained import shapes
from tiny_models import random_model

FAMILIES = ["gpt-tiny", "llama-tiny"]
TOL = 1e-5


def random_tokens(m, B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, m.config.vocab_size, (B, T), generator=g)


def max_diff(a, b):
    return (a - b).abs().max().item()


def hand_hybrid_mask(n_prefix, n_block):
    """[prefix ; block] written out from docs/method.md: a prefix slot sees the prefix slots up to
    itself (causal); a block slot sees every prefix slot and its whole block (bidirectional)."""
    T = n_prefix + n_block
    mask = torch.zeros(T, T, dtype=torch.bool)
    for q in range(T):
        for k in range(T):
            mask[q, k] = k <= q if q < n_prefix else True
    return mask  # (T, T)


def cache_snapshot(cache):
    return cache.length, [t.clone() for t in cache.k], [t.clone() for t in cache.v]


def assert_cache_equal(cache, snapshot, atol=0.0):
    length, ks, vs = snapshot
    assert cache.length == length
    for layer, (k0, v0, k1, v1) in enumerate(zip(ks, vs, cache.k, cache.v)):
        # the committed slots [0, length): a block forward may use the scratch slots past the length
        # (the next forward overwrites them), but must not change or add a committed key/value
        k0, v0, k1, v1 = (t[:, :, :length] for t in (k0, v0, k1, v1))
        assert max_diff(k0, k1) <= atol, f"layer {layer}: cache changed"
        assert max_diff(v0, v1) <= atol, f"layer {layer}: cache changed"

# -----------------------------------------------------------------------------
# 1-3: the KV cache against one uncached forward


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("step", [1, 3])
def test_cached_decoding_equals_full_forward(family, step):
    """Prefill 7 tokens, then feed the rest `step` tokens at a time through the cache."""
    m = random_model(family)
    idx = random_tokens(m, 2, 22)  # batch 2
    full, _ = m(idx)  # (2, 22, V): one causal forward, no cache
    cache = m.new_cache(2, 22, "cpu")
    pieces = [m(idx[:, :7], cache=cache)[0]]
    for t in range(7, 22, step):
        pieces.append(m(idx[:, t:t + step], cache=cache)[0])
    assert cache.length == 22
    assert max_diff(torch.cat(pieces, dim=1), full) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_block_on_cache_equals_full_forward_and_leaves_cache_alone(family):
    m = random_model(family, seed=1)
    P, k = 9, 4
    prefix, block = random_tokens(m, 2, P, seed=1), random_tokens(m, 2, k, seed=2)
    block[:, 1] = m.config.vocab_size - 1  # a mask token among real ones, as during decoding
    mask = hand_hybrid_mask(P, k)  # (P + k, P + k)

    full, _ = m(torch.cat([prefix, block], dim=1), mask=mask)  # no cache, positions 0..P+k-1

    cache = m.new_cache(2, 32, "cpu")
    m(prefix, cache=cache)
    before = cache_snapshot(cache)
    block_logits, _ = m(block, mask=mask[P:], cache=cache, n_commit=0)  # block's rows: (k, P + k)
    assert max_diff(block_logits, full[:, P:]) <= TOL
    assert_cache_equal(cache, before)  # length P and every slot exactly as before


@pytest.mark.parametrize("family", FAMILIES)
def test_commit_previous_and_new_block_in_one_forward(family):
    """forward([prev ; block], n_commit=len(prev)) == commit prev causally, then the block alone."""
    m = random_model(family, seed=2)
    P, n_prev, k = 6, 4, 4
    prefix, prev, block = (random_tokens(m, 2, n, seed=s) for n, s in ((P, 3), (n_prev, 4), (k, 5)))
    block[:, 0] = block[:, 3] = m.config.vocab_size - 1
    mask = hand_hybrid_mask(P + n_prev, k)  # the previous block is part of the causal prefix now

    one, two = m.new_cache(2, 32, "cpu"), m.new_cache(2, 32, "cpu")
    m(prefix, cache=one)
    m(prefix, cache=two)
    combined, _ = m(torch.cat([prev, block], dim=1), mask=mask[P:], cache=one, n_commit=n_prev)
    prev_logits, _ = m(prev, cache=two)  # default: causal on top of the cache
    block_logits, _ = m(block, mask=mask[P + n_prev:], cache=two, n_commit=0)

    assert max_diff(combined[:, :n_prev], prev_logits) <= TOL
    assert max_diff(combined[:, n_prev:], block_logits) <= TOL
    assert one.length == two.length == P + n_prev
    assert_cache_equal(one, cache_snapshot(two), atol=TOL)
    full, _ = m(torch.cat([prefix, prev, block], dim=1), mask=mask)  # both equal no cache at all
    assert max_diff(combined, full[:, P:]) <= TOL

# -----------------------------------------------------------------------------
# 4: every mask function against a matrix written by hand


def test_causal_mask():
    assert dense_mask(model_lib.causal_mask, 4, 4).int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1]]
    # 3 new tokens on top of a cache of 2: queries are slots 2, 3, 4
    assert dense_mask(model_lib.causal_mask, 3, 5, query_offset=2).int().tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1]]


def test_hybrid_mask():
    # a block of 4 after a prefix of 3 (sbd.hybrid_mask's docstring)
    assert dense_mask(lambda q, k: sbd.hybrid_mask(q, k, 3), 7, 7).int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1]]
    # decoding: 2 cached slots, 1 token committed causally (slot 2), then a block of 3 (slots 3-5)
    mask = dense_mask(lambda q, k: sbd.hybrid_mask(q, k, 3), 4, 6, query_offset=2)
    assert mask.int().tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1]]


def training_mask_rows(phase):
    return dense_mask(lambda q, k: sbd.sbd_training_mask(q, k, 8, 4, phase), 16, 16).int().tolist()


def test_sbd_training_mask_phase_0():
    # L = 8, k = 4: columns c0..c7 | n0..n7 (docs/method.md's worked example, 0-based)
    assert training_mask_rows(0) == [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # c0
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # c7
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],  # n0: block 0 sees only itself
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],  # n4: block 1 sees c0..c3 and itself
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]]


def test_sbd_training_mask_phase_1():
    # blocks start at 1 and 5: n0 is a block of its own ([-3, 0]), then n1..n4, then n5..n7
    assert training_mask_rows(1) == [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # c0
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # c7
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # n0
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0],  # n1..n4 see c0
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1],  # n5..n7 see c0..c4
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]]

# -----------------------------------------------------------------------------
# 5: Llama-3.1 facts (docs/llama.md)


def test_llama31_8b_shapes_and_parameter_count():
    config = LlamaConfig()
    assert config.ffn_hidden == 14336
    with torch.device("meta"):  # shapes only, nothing allocated
        m = model_lib.Llama(config)
    assert sum(p.numel() for p in m.parameters()) == 8_030_261_248
    assert m.layers[0].attention.wk.weight.shape == (1024, 4096)
    assert m.layers[0].feed_forward.w1.weight.shape == (14336, 4096)
    assert m.output.weight.shape == (128256, 4096)

# -----------------------------------------------------------------------------
# 6: clear errors


@pytest.mark.parametrize("family", FAMILIES)
def test_position_past_the_context(family):
    m = random_model(family)
    n = m.max_seq_len
    with pytest.raises(ValueError, match=f"position {n} is past the model's context of {n} tokens"):
        m(torch.zeros(1, 2, dtype=torch.long), pos=torch.tensor([0, n]))
    if family == "gpt-tiny":  # the same through the cache: its slot is the position
        cache = m.new_cache(1, n + 4, "cpu")
        m(torch.zeros(1, n, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="past the model's context"):
            m(torch.zeros(1, 1, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_overflow(family):
    m = random_model(family)
    cache = m.new_cache(1, 5, "cpu")
    m(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"KV cache full: 3 cached \+ 3 new tokens > max_len 5"):
        m(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.length == 3
    with pytest.raises(ValueError, match=r"KV cache full: 3 cached \+ 4 new tokens > max_len 5"):
        # the 2 uncommitted tokens need scratch slots too
        m(torch.zeros(1, 4, dtype=torch.long), cache=cache, n_commit=2,
          mask=torch.ones(4, 7, dtype=torch.bool))
    m(torch.zeros(1, 2, dtype=torch.long), cache=cache, n_commit=1,
      mask=torch.ones(2, 5, dtype=torch.bool))
    assert cache.length == 4


def test_n_commit_needs_a_cache():
    m = random_model("gpt-tiny")
    with pytest.raises(ValueError, match="n_commit only means something with a KV cache"):
        m(torch.zeros(1, 4, dtype=torch.long), n_commit=2)


def tiny_checkpoint(family, m):
    presets = {"gpt-tiny": shapes.GPT_PRESETS, "llama-tiny": shapes.LLAMA_PRESETS}[family]
    args = presets[family]
    return dict(model=m.state_dict(), model_family=family.split("-")[0], model_args=dict(args),
                stage="ntp")


@pytest.mark.parametrize("family", FAMILIES)
def test_load_checkpoint_round_trip_and_shape_mismatch(family, tmp_path):
    m = random_model(family)
    path = str(tmp_path / "ckpt.pt")
    checkpoint_lib.save_checkpoint(tiny_checkpoint(family, m), path)
    loaded, _ = checkpoint_lib.load_checkpoint(path)
    idx = random_tokens(m, 1, 10)
    assert torch.equal(loaded(idx)[0], m(idx)[0])

    checkpoint = tiny_checkpoint(family, m)
    name = {"gpt-tiny": "transformer.h.1.mlp.c_fc.weight",
            "llama-tiny": "layers.1.attention.wk.weight"}[family]
    checkpoint["model"][name] = checkpoint["model"][name][:-1]  # one row short
    checkpoint_lib.save_checkpoint(checkpoint, path)
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape"):
        checkpoint_lib.load_checkpoint(path)


def test_missing_or_outdated_checkpoint(tmp_path):
    checkpoint = tiny_checkpoint("gpt-tiny", random_model("gpt-tiny"))
    del checkpoint["stage"]  # a checkpoint of an earlier layout
    checkpoint_lib.save_checkpoint(checkpoint, str(tmp_path / "old.pt"))
    with pytest.raises(ValueError, match="older version of train.py: train it again"):
        checkpoint_lib.load_checkpoint(str(tmp_path / "old.pt"))
    with pytest.raises(ValueError,
                       match=r"no checkpoint at .*nope\.pt: train one first \(python train\.py"):
        checkpoint_lib.load_checkpoint(str(tmp_path / "nope.pt"))
