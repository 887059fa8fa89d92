"""
Assignment 6 (Llama internals), checks beyond test_model.py and test_llama_io.py, by properties
and cases worked by hand, with tolerances that accept any correct way of computing (float32 or
float64, pow or exp-log, complex numbers or pairs of reals):

- RoPE frequencies: without scaling, theta^(-2i/d) at relative 1e-5 (a float32 exp-log computation
  is off by ~1e-6); Llama 3.1's scaling keeps the high frequencies, divides the low ones by the
  scale and puts the ones in between strictly between the two;
- apply_rotary turns each pair of a head by its angle (basis vectors by hand), per-row positions, a
  rotation keeps each pair's length, bf16 in and out;
- hf_unpermute undoes hf_permute exactly for any head count and head size.
The rules written out in full (element by element, Meta's complex-number rotary) are hidden tests
(tests/hidden/test_hidden_llama.py).
"""


import math

import pytest
import torch

from model import LlamaConfig, apply_rotary, rope_frequencies, rotary_cos_sin
from pretrained.load_llama import hf_permute, hf_unpermute
from pretrained.shapes import LLAMA_PRESETS

RTOL = 1e-5


def test_llama31_scaling_keeps_divides_and_interpolates():
    """docs/llama.md: for Llama-3.1-8B (head_dim 128, scale 8) frequencies 0-28 are kept, 35-63
    divided by 8, and 29-34 lie strictly between the two."""
    got = rope_frequencies(LlamaConfig()).double()
    assert got.shape == (64,)
    base = torch.tensor([1.0 / 500000.0 ** (2 * i / 128) for i in range(64)], dtype=torch.float64)
    torch.testing.assert_close(got[:29], base[:29], rtol=RTOL, atol=0.0)
    torch.testing.assert_close(got[35:], base[35:] / 8, rtol=RTOL, atol=0.0)
    assert (got[29:35] < base[29:35] * (1 - 1e-4)).all(), "29-34: less than kept"
    assert (got[29:35] > base[29:35] / 8 * (1 + 1e-4)).all(), "29-34: more than divided"
    assert (got[1:] < got[:-1]).all(), "frequencies still fall with i"


def test_rope_without_scaling():
    config = LlamaConfig(**{**LLAMA_PRESETS["llama-tiny"], "use_scaled_rope": False})  # head_dim 16
    got = rope_frequencies(config).double()
    expected = torch.tensor([1.0 / 500000.0 ** (2 * i / 16) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=0.0)


def test_apply_rotary_turns_each_pair_by_its_angle():
    """One head of 4 = two pairs (x[0], x[1]) and (x[2], x[3]), frequencies f = [1, 0.5], position
    2: pair i turns by 2 f_i. The basis vectors by hand: (1, 0) -> (cos a, sin a), (0, 1) ->
    (-sin a, cos a)."""
    cos, sin = rotary_cos_sin(torch.tensor([2]), torch.tensor([1.0, 0.5]))  # (1, 2) each
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]).view(2, 1, 1, 4)  # (B, H, T, D)
    a, b = 2.0, 1.0  # the two pairs' angles
    expected = torch.tensor([[math.cos(a), math.sin(a), -math.sin(b), math.cos(b)],
                             [-math.sin(a), math.cos(a), math.cos(b), math.sin(b)]])
    torch.testing.assert_close(apply_rotary(x, cos, sin).view(2, 4), expected, rtol=RTOL,
                               atol=RTOL)


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
