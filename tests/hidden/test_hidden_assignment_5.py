"""
Hidden (the grader's): assignment 5's reference decoder (decode.sbd, decode.fill) against the
uncached reference of test_hidden_decoding.py, token for token and forward for forward: k = 1, 4
and 16, the confidence and factor rules, slot 0 by the rule (first_from_ntp False), stop tokens,
the whole context; fill on its own (one block, then the next, whose first forward commits the
previous block) and a one-token prompt (nothing to prefill). GPT model only (the Llama needs
assignment 6). Models are float64, so tokens compare exactly.
"""

import pytest
import torch
from test_hidden_decoding import reference_sbd

import decode
import sampling
from test_decoding import mask_id_of, random_model, random_prompts

GAMMA = 1.5


def settings_of(m, **fields):
    return sampling.DecodeSettings(mask_id=mask_id_of(m), **fields)


def forwards_per_block(widths, k):
    """The forwards of each block, read off the widths: a block's first forward also feeds what it
    commits (wider than k), its later forwards feed the block alone (at most k)."""
    starts = [i for i, width in enumerate(widths) if width > k] + [len(widths)]
    return [end - start for start, end in zip(starts, starts[1:])]


@pytest.mark.parametrize("k, rule, first_from_ntp", [
    (1, "entropy", True), (4, "entropy", True), (16, "entropy", True), (4, "confidence", True),
    (4, "factor", True), (4, "entropy", False)])
def test_sbd_equals_uncached(k, rule, first_from_ntp):
    m = random_model("gpt-tiny")
    gamma = 0.5 if rule == "factor" else GAMMA
    settings = settings_of(m, k=k, gamma=gamma, rule=rule, first_from_ntp=first_from_ntp)
    for seed in range(3):
        prompt = random_prompts(m, 1, 5, seed=seed + k)
        tokens, stats = decode.sbd(m, prompt, settings, 22)
        ref_tokens, ref_forwards = reference_sbd(m, prompt[0].tolist(), k, gamma, rule, 22,
                                                 first_from_ntp=first_from_ntp)
        assert tokens[0] == ref_tokens, f"prompt {seed}: tokens differ from the uncached reference"
        assert stats.nfe == [len(ref_forwards)] == [len(stats.widths)], (
            f"prompt {seed}: one forward counted per forward the reference takes")
        starts = [start for start, _ in ref_forwards]
        assert [starts.count(s) for s in sorted(set(starts))] == forwards_per_block(
            stats.widths, k), f"prompt {seed}: each block takes the reference's forwards"
        assert stats.tokens == [22] and stats.prefill_forwards == 1


def test_stop_token_ends_the_row_and_truncates():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 5, seed=11)
    plain, _ = decode.sbd(m, prompt, settings_of(m, k=8, gamma=GAMMA), 30)
    for stop in (plain[0][3], plain[0][12]):
        tokens, stats = decode.sbd(m, prompt, settings_of(m, k=8, gamma=GAMMA, stop_ids=[stop]), 30)
        ref_tokens, ref_forwards = reference_sbd(m, prompt[0].tolist(), 8, GAMMA, "entropy", 30,
                                                 stop_ids=[stop])
        assert tokens[0] == ref_tokens and tokens[0][-1] == stop, "the row ends at its stop token"
        assert stats.nfe == [len(ref_forwards)], "no forward after the row's stop token"
        assert stats.tokens == [len(ref_tokens)], "the stop token counts as a generated token"


def test_decoding_may_fill_the_whole_context():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 5, seed=5)
    n = m.max_seq_len - 5
    tokens, _ = decode.sbd(m, prompt, settings_of(m, k=16, gamma=GAMMA), n)
    assert tokens[0] == reference_sbd(m, prompt[0].tolist(), 16, GAMMA, "entropy", n)[0], (
        "the cache holds the prompt and max_new_tokens slots, no more: the last block is cut")


def test_fill_fills_one_block_and_commits_nothing():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 5)
    ref_tokens, ref_forwards = reference_sbd(m, prompt[0].tolist(), 8, GAMMA, "entropy", 16)
    settings = settings_of(m, k=8, gamma=GAMMA)
    with torch.inference_mode():
        cache = m.new_cache(1, prompt.size(1) + 16, prompt.device)
        prev = decode.prefill(m, prompt, cache)
        for b in range(2):  # block 0 after the pending prompt token, block 1 after block 0
            block = prev.new_full((1, 8), mask_id_of(m))
            logits = decode.hybrid_forward(m, cache, torch.cat([prev, block], dim=1), prev.size(1))
            block, _, _ = decode.reveal_first(block, block == mask_id_of(m),
                                              logits[:, :prev.size(1)], settings)
            widths = [logits.size(1)]
            block, q = decode.fill(m, cache, block, logits[:, prev.size(1):], settings, None,
                                   widths)
            assert block.tolist() == [ref_tokens[8 * b:8 * b + 8]], f"block {b}"
            forwards = sum(start == 8 * b for start, _ in ref_forwards)
            assert widths == [prev.size(1) + 8] + [8] * (forwards - 1), (
                f"block {b}: fill runs the reference's forwards, each of the block alone")
            assert q is None, "greedy: no distributions to return"
            assert cache.length == 5 + 8 * b, (
                "the first forward commits prev; fill's forwards commit nothing of the block")
            prev = block


def test_one_token_prompt_has_no_prefill():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 1)
    tokens, stats = decode.sbd(m, prompt, settings_of(m, k=4, gamma=GAMMA), 9)
    assert tokens[0] == reference_sbd(m, prompt[0].tolist(), 4, GAMMA, "entropy", 9)[0], (
        "a one-token prompt: nothing to prefill, the token itself is the pending prev")
    assert stats.prefill_forwards == 0, "prefill runs no forward for a one-token prompt"
    assert stats.tokens == [9]
