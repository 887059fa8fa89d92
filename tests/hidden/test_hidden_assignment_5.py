"""
Hidden (the grader's): assignment 5's decode_block on its own against the uncached reference of
test_hidden_decoding.py (one block, then the next one whose first forward commits the previous
block, and a batch in which one row is already done), and a one-token prompt (nothing to prefill),
on the GPT model only (the Llama needs assignment 6). Models are float64, so tokens compare
exactly.
"""

import torch
from test_hidden_decoding import reference_sbd

import generate
import sampling
from test_decoding import mask_id_of, random_model, random_prompts

GAMMA = 1.5


def test_decode_block_fills_one_block_and_commits_prev():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 5)
    ref_tokens, ref_forwards = reference_sbd(m, prompt[0].tolist(), 8, GAMMA, "entropy", 16)
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=GAMMA)
    stop = torch.zeros(0, dtype=torch.long)
    with torch.inference_mode():
        cache = m.new_cache(1, 5 + 16, prompt.device, dtype=torch.float64)
        prev, _ = generate.prefill(m, prompt, cache)
        assert cache.length == 4 and prev.tolist() == [[prompt[0, -1].item()]]
        for b in range(2):  # block 0 commits the pending prompt token, block 1 commits block 0
            active = torch.ones(1, dtype=torch.bool)
            block, finished, nfe, steps = generate.decode_block(m, cache, prev, 8, active,
                                                                settings, stop)
            assert block.tolist() == [ref_tokens[8 * b:8 * b + 8]], f"block {b}"
            forwards = sum(start == 8 * b for start, _ in ref_forwards)
            assert nfe.tolist() == [forwards] == [len(steps)], (
                f"block {b}: one forward counted, and one step recorded, per forward")
            assert finished.tolist() == [False], "no stop token: the row is not finished"
            assert cache.length == 5 + 8 * b, (
                "the first forward commits prev, and nothing of the block")
            prev = block

        # two rows, the second already done: it takes no part (its block stays masks, no
        # forwards counted)
        cache = m.new_cache(2, 5 + 16, prompt.device, dtype=torch.float64)
        prev, _ = generate.prefill(m, prompt.repeat(2, 1), cache)
        active = torch.tensor([True, False])
        block, finished, nfe, _ = generate.decode_block(m, cache, prev, 8, active, settings, stop)
        assert block[0].tolist() == ref_tokens[:8], "the active row decodes as alone"
        assert block[1].tolist() == [mask_id_of(m)] * 8, "an inactive row's block stays masks"
        assert nfe.tolist() == [nfe[0].item(), 0] and nfe[0] > 0, (
            "forwards count for the active row only")


def test_one_token_prompt_has_no_prefill():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 1)
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=4, gamma=GAMMA)
    tokens, stats = generate.sbd_generate(m, prompt, settings, 9)
    assert tokens[0] == reference_sbd(m, prompt[0].tolist(), 4, GAMMA, "entropy", 9)[0], (
        "a one-token prompt: nothing to prefill, the token itself is the pending prev")
    assert stats.prefill_forwards == 0, "prefill runs no forward for a one-token prompt"
    assert stats.tokens == [9]
