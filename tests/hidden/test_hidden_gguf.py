"""
Hidden (the grader's): llama.cpp's converter written out, which would pass for assignment 6's
pieces: its q/k permutation (HF -> Meta's interleaved pairs, hf_unpermute's job) and its
rope_freqs.weight divisors for Llama 3.1's scaling (rope_frequencies' rule). A GGUF written with
them must load to the HF checkpoint's logits (tests/test_gguf.py has the rest; skipped without the
gguf package).
"""

import math

import numpy as np
import pytest
import torch
from test_gguf import IDX, gguf_from_hf, logits, random_hf_checkpoint, save_hf
from test_gguf_tokenizer import TOKENS

from model import LlamaConfig
from pretrained.load_gguf import load_gguf
from pretrained.load_llama import hf_unpermute, load_llama

pytest.importorskip("gguf")


def converter_permute_written_out(w, n_heads):
    """llama.cpp's LlamaModel.permute: each head's rows, as (2 halves, head_dim/2), read out pair
    by pair."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, -1).transpose(1, 2).reshape(rows, -1)


def test_the_converters_permutation_is_hf_unpermute():
    w = torch.randn(4 * 16, 8, generator=torch.Generator().manual_seed(0))
    for n_heads in (1, 2, 4):
        assert torch.equal(converter_permute_written_out(w, n_heads), hf_unpermute(w, n_heads))


def converter_rope_freqs(c, factor=8.0, low=1.0, high=4.0, original=8192):
    """The rope_freqs.weight divisors llama.cpp's converter writes for Llama 3.1 rope scaling."""
    divisors = []
    for i in range(0, c.head_dim, 2):
        wavelen = 2 * math.pi * c.rope_theta ** (i / c.head_dim)
        smooth = (original / wavelen - low) / (high - low)
        divisors.append(1.0 if wavelen < original / high else factor if wavelen > original / low
                        else 1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


@pytest.mark.parametrize("scaled", [False, True])
def test_converter_layout_matches_hf_checkpoint(tmp_path, scaled):
    """q/k: a GGUF holds the converter's permutation of HF's q/k (Meta's interleaved pairs,
    model.py's own), loaded unchanged; it must equal load_llama's model of the HF checkpoint, also
    at late positions where Llama 3.1's rope scaling matters. Without the permutation it differs."""
    c = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=len(TOKENS),
                    ffn_hidden_size=96, rope_theta=500000.0, max_seq_len=512, use_scaled_rope=False)
    hf = random_hf_checkpoint(c)
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192) if scaled else None
    ref, _ = load_llama(save_hf(hf, c, tmp_path / "hf", scaling))
    freqs = converter_rope_freqs(c) if scaled else None
    model, _ = load_gguf(gguf_from_hf(hf, c, tmp_path / "m.gguf", rope_freqs=freqs))
    assert model.config.use_scaled_rope == scaled
    late = torch.arange(480, 492)
    for pos in (None, late):
        assert (logits(model, IDX, pos) - logits(ref.eval(), IDX, pos)).abs().max() < 1e-5
    as_hf = gguf_from_hf(hf, c, tmp_path / "u.gguf", permute=False, rope_freqs=freqs)
    unpermuted, _ = load_gguf(as_hf)
    assert (logits(unpermuted, IDX) - logits(ref, IDX)).abs().max() > 1e-3
