"""
Hidden (the grader's): assignment 6's Llama pieces against references written out here, each in
substance a solution that a student could paste: RoPE's frequencies computed element by element
from docs/llama.md's rule, Meta's complex-number rotary, attention with K/V heads repeated
explicitly, and the row map of HF's permutation. tests/test_assignment_6.py, tests/test_model.py
and tests/test_llama_io.py check the same functions by their properties and on cases by hand.
"""

import math

import pytest
import torch

import model as model_lib
from model import LlamaConfig, apply_rotary, rope_frequencies, rotary_cos_sin
from pretrained.load_llama import hf_permute
from tiny_models import random_model

RTOL = 1e-5
TOL = 1e-5


def max_diff(a, b):
    return (a - b).abs().max().item()


def meta_rotary(x, pos, inv_freq):
    """Meta's reference: pairs (x[2i], x[2i+1]) as complex numbers times e^{i pos freq_i};
    x (B, T, h, hd)."""
    angles = torch.outer(pos.float(), inv_freq)  # (T, hd/2)
    freqs_cis = torch.polar(torch.ones(len(pos), len(inv_freq)), angles)  # (T, hd/2)
    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, T, h, hd/2)
    return torch.view_as_real(x_c * freqs_cis[None, :, None, :]).flatten(3)  # (B, T, h, hd)


def test_llama31_rope_frequencies_and_their_ranges():
    """docs/llama.md's rule with its constants (theta 500000, head_dim 128, scale 8, factors 1
    and 4, context 8192)."""
    got = model_lib.rope_frequencies(LlamaConfig()).double()  # (64,)
    assert got.shape == (64,)
    expected, kind = [], []
    for i in range(64):
        freq = 1.0 / 500000.0 ** (2 * i / 128)
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4:
            expected.append(freq), kind.append("keep")
        elif wavelen > 8192 / 1:
            expected.append(freq / 8), kind.append("divide")
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            expected.append((1 - smooth) * freq / 8 + smooth * freq), kind.append("smooth")
    assert [i for i, c in enumerate(kind) if c == "keep"] == list(range(0, 29))
    assert [i for i, c in enumerate(kind) if c == "smooth"] == list(range(29, 35))
    assert [i for i, c in enumerate(kind) if c == "divide"] == list(range(35, 64))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-6,
                               atol=0.0)
    # and the three ranges seen in the model's own output
    base = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    torch.testing.assert_close(got[:29], base[:29], rtol=1e-6, atol=0.0)
    torch.testing.assert_close(got[35:], base[35:] / 8, rtol=1e-6, atol=0.0)
    assert (got[29:35] < base[29:35] * (1 - 1e-4)).all()
    assert (got[29:35] > base[29:35] / 8 * (1 + 1e-4)).all()


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


def test_gqa_attention_equals_explicit_head_repetition():
    m = random_model("llama-tiny", seed=3)
    c = m.config  # 4 query heads, 2 K/V heads of 16
    attn = m.layers[0].attention
    B, T, hd, n_rep = 2, 7, c.head_dim, c.n_heads // c.n_kv_heads
    x = torch.randn(B, T, c.dim, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(T)
    cos, sin = model_lib.rotary_cos_sin(pos, m.inv_freq)
    got = attn(x, cos, sin, 0, None, None, T)  # (B, T, dim), causal

    q = meta_rotary((x @ attn.wq.weight.T).view(B, T, c.n_heads, hd), pos, m.inv_freq)
    k = meta_rotary((x @ attn.wk.weight.T).view(B, T, c.n_kv_heads, hd), pos, m.inv_freq)
    v = (x @ attn.wv.weight.T).view(B, T, c.n_kv_heads, hd)
    # query head h uses K/V head h // n_rep
    k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)  # (B, T, nh, hd)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(c.n_heads):
        scores = q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(hd)  # (B, T, T)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)  # (B, T, T)
        heads.append(probs @ v[:, :, h])  # (B, T, hd)
    expected = torch.cat(heads, dim=-1) @ attn.wo.weight.T  # (B, T, dim)
    assert max_diff(got, expected) <= TOL


def test_apply_rotary_is_meta_rotary():
    g = torch.Generator().manual_seed(0)
    B, nh, T, hd = 2, 3, 5, 8
    x = torch.randn(B, nh, T, hd, generator=g)
    inv_freq = torch.rand(hd // 2, generator=g)
    pos = torch.arange(100, 100 + T)
    cos, sin = rotary_cos_sin(pos, inv_freq)  # (T, hd/2) each
    expected = meta_rotary(x.transpose(1, 2), pos, inv_freq).transpose(1, 2)  # (B, nh, T, hd)
    torch.testing.assert_close(apply_rotary(x, cos, sin), expected, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("n_heads, head_dim, dim", [(1, 4, 3), (3, 8, 5), (4, 16, 2)])
def test_hf_permute_moves_each_row_where_hf_wants_it(n_heads, head_dim, dim):
    """Within a head, HF's row i holds Meta's row 2i (first halves) and row 2(i - hd/2) + 1
    (second halves)."""
    w = torch.randn(n_heads * head_dim, dim, generator=torch.Generator().manual_seed(n_heads))
    meta_row = [h * head_dim + (2 * i if i < head_dim // 2 else 2 * (i - head_dim // 2) + 1)
                for h in range(n_heads) for i in range(head_dim)]
    assert torch.equal(hf_permute(w, n_heads), w[meta_row])
