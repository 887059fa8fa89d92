"""Hidden (the grader's): cached SBD == the uncached reference (test_hidden_decoding.py) on a tiny
Qwen-3 (test_qwen3.py's), and cached NTP == uncached NTP on it."""

import pytest
import torch
from test_hidden_decoding import forwards_of_row, reference_sbd
from test_qwen3 import random_qwen3

import sampling
import tiny_models
from serving import batched
from test_decoding import reference_ntp


@pytest.mark.parametrize("k", [1, 4, 16])
def test_cached_sbd_equals_uncached_on_qwen3(k):
    m = random_qwen3()
    prompts = torch.randint(0, 63, (2, 5), generator=torch.Generator().manual_seed(k))
    settings = sampling.DecodeSettings(mask_id=63, k=k, gamma=2.0)
    tokens, stats = batched.sbd_generate(m, prompts, settings, 22, record_steps=True)
    for b in range(2):
        ref_tokens, ref_forwards = reference_sbd(m, prompts[b].tolist(), k, 2.0, "entropy", 22)
        assert tokens[b] == ref_tokens and forwards_of_row(stats, b) == ref_forwards
    ntp, _ = tiny_models.ntp(m, prompts, 20)
    assert all(ntp[b] == reference_ntp(m, prompts[b].tolist(), 20) for b in range(2))
