"""
Assignment 6 (Llama internals), checks beyond test_model.py and test_llama_io.py, with tolerances
that accept any correct way of computing (float32 or float64, pow or exp-log, complex numbers or
pairs of reals):

- RoPE frequencies against docs/llama.md's rule at relative 1e-5 (a float32 exp-log computation is
  off by ~1e-6, so test_model.py's 1e-6 would be too tight for it);
- apply_rotary against Meta's complex-number reference, with per-row positions, in bf16 (returns
  bf16);
- hf_unpermute undoes hf_permute exactly for any head count and head size.
"""

import math

import pytest
import torch

from model import LLAMA_PRESETS, LlamaConfig, apply_rotary, rope_frequencies, rotary_cos_sin
from pretrained.load_llama import hf_permute, hf_unpermute
from test_model import meta_rotary

RTOL = 1e-5


def test_llama31_rope_frequencies():
    """docs/llama.md: theta 500000, head_dim 128, scale 8, low/high factors 1 and 4, original
    context 8192."""
    got = rope_frequencies(LlamaConfig()).double()
    assert got.shape == (64,)
    expected = []
    for i in range(64):
        freq = 1.0 / 500000.0 ** (2 * i / 128)
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4:  # high frequencies (i < 29): kept
            expected.append(freq)
        elif wavelen > 8192 / 1:  # low frequencies (i >= 35): divided by the scale factor
            expected.append(freq / 8)
        else:  # in between: interpolated
            smooth = (8192 / wavelen - 1) / (4 - 1)
            expected.append((1 - smooth) * freq / 8 + smooth * freq)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64),
                               rtol=RTOL, atol=0.0)


def test_rope_without_scaling():
    config = LlamaConfig(**{**LLAMA_PRESETS["llama-tiny"], "use_scaled_rope": False})  # head_dim 16
    got = rope_frequencies(config).double()
    expected = torch.tensor([1.0 / 500000.0 ** (2 * i / 16) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=0.0)


def test_apply_rotary_is_meta_rotary():
    g = torch.Generator().manual_seed(0)
    B, nh, T, hd = 2, 3, 5, 8
    x = torch.randn(B, nh, T, hd, generator=g)
    inv_freq = torch.rand(hd // 2, generator=g)
    pos = torch.arange(100, 100 + T)
    cos, sin = rotary_cos_sin(pos, inv_freq)  # (T, hd/2) each
    expected = meta_rotary(x.transpose(1, 2), pos, inv_freq).transpose(1, 2)  # (B, nh, T, hd)
    torch.testing.assert_close(apply_rotary(x, cos, sin), expected, rtol=RTOL, atol=RTOL)


def test_apply_rotary_per_row_positions_and_dtype():
    g = torch.Generator().manual_seed(1)
    B, nh, T, hd = 3, 2, 4, 8
    x = torch.randn(B, nh, T, hd, generator=g)
    inv_freq = torch.rand(hd // 2, generator=g)
    # (B, T): each row its own positions
    pos = torch.stack([torch.arange(T) + 7 * b for b in range(B)])
    cos, sin = rotary_cos_sin(pos, inv_freq)  # (B, T, hd/2) each
    got = apply_rotary(x, cos, sin)
    for b in range(B):
        row_cos, row_sin = rotary_cos_sin(pos[b], inv_freq)  # (T, hd/2)
        alone = apply_rotary(x[b:b + 1], row_cos, row_sin)
        torch.testing.assert_close(got[b:b + 1], alone, rtol=RTOL, atol=RTOL)
    # a rotation keeps each pair's length
    pair_norms = lambda t: t.float().unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(pair_norms(got), pair_norms(x), rtol=RTOL, atol=RTOL)
    bf16 = apply_rotary(x.bfloat16(), cos, sin)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == x.shape
    # bf16 keeps ~3 significant digits
    torch.testing.assert_close(bf16.float(), got, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("n_heads, head_dim, dim", [(1, 4, 3), (3, 8, 5), (4, 16, 2)])
def test_hf_unpermute_inverts_hf_permute(n_heads, head_dim, dim):
    w = torch.randn(n_heads * head_dim, dim, generator=torch.Generator().manual_seed(n_heads))
    permuted = hf_permute(w, n_heads)
    assert permuted.shape == w.shape and not torch.equal(permuted, w)
    assert torch.equal(hf_unpermute(permuted, n_heads), w)
    assert torch.equal(hf_permute(hf_unpermute(w, n_heads), n_heads), w)
    # within a head, HF's row i holds Meta's row 2i (first halves) and row 2(i - hd/2) + 1
    # (second halves)
    meta_row = [2 * i if i < head_dim // 2 else 2 * (i - head_dim // 2) + 1
                for i in range(head_dim)]
    assert torch.equal(permuted[:head_dim], w[meta_row])
