"""The static-cache decoder (static.py, the GPU path that torch.compile can capture as a CUDA
graph) gives the tokens of the dynamic-cache decoder, and a static block forward the logits of the
dynamic one. On a CPU, without compiling: the shapes and the masks are what is checked here."""

import pytest
import torch

import generate
import tiny_models
from bench.static import StaticCache, forward_fn, static_ntp_generate, step_inputs

FAMILIES = ["gpt-tiny", "llama-tiny"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("B, T0", [(1, 1), (1, 5), (3, 4)])
def test_static_ntp_equals_dynamic(family, B, T0):
    m = tiny_models.random_model(family, std=0.5, dtype=torch.float64)
    g = torch.Generator().manual_seed(T0)
    prompt = torch.randint(0, m.config.vocab_size - 1, (B, T0), generator=g)
    dynamic, _ = tiny_models.ntp(m, prompt, 20, mask_id=m.config.vocab_size - 1)
    assert static_ntp_generate(m, prompt, 20, mask_id=m.config.vocab_size - 1) == dynamic


@pytest.mark.parametrize("family", FAMILIES)
def test_static_block_forward_equals_dynamic(family):
    """[pending ; block of 8] on a cache of 6 tokens: the dynamic path (generate.block_forward) and
    the static one (the whole buffer, unfilled slots masked) give the same logits."""
    m = tiny_models.random_model(family, std=0.5, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 60, (1, 6), generator=g)
    pending = torch.randint(0, 60, (1, 1), generator=g)
    block = torch.full((1, 8), m.config.vocab_size - 1)
    with torch.inference_mode():
        cache = m.new_cache(1, 32, "cpu", torch.float64)
        m(prefix, cache=cache)
        causal, logits = generate.block_forward(m, cache, pending, block)
        static = StaticCache(m, 1, 32, "cpu", torch.float64)
        first = torch.tensor(0)
        pos, mask = step_inputs(static, first, 6)
        forward_fn(m)(prefix, pos, mask, static)
        pos, mask = step_inputs(static, torch.tensor(6), 9, block_start=1)
        out = forward_fn(m)(torch.cat([pending, block], dim=1), pos, mask, static)
    assert (torch.allclose(out[:, :1], causal, atol=1e-10)
            and torch.allclose(out[:, 1:], logits, atol=1e-10))
