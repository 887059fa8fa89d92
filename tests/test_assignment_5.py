"""
Assignment 5 (block decoding): properties that every correct decoder has, checked on the reference
decoder for one prompt (decode.sbd) on the GPT model only (the Llama needs assignment 6). No
uncached reference decoder here (the grader's hidden tests have one):

- blocks of one are next-token decoding: the block's first token comes from the causal logits, so
  k = 1 leaves nothing to the reveal rule, and SBD is greedy NTP, one forward per token;
- a drafter that is always right fills a block per forward: a model whose block slots predict, with
  certainty, the token greedy NTP writes at their position decodes to NTP's tokens, one forward
  per block, when the rule reveals everything at once;
- decoding goes on from a committed block as from a prompt that holds it: after a block is
  committed, the cache holds what a prefill of the same tokens holds (a cache that kept a block's
  own keys, or lost a committed token, decodes differently);
- a one-token prompt has nothing to prefill; a row stops at its stop token without waiting for the
  rest of its block; the last block is cut to max_new_tokens; the mask token is never emitted.
Models are float64, so tokens compare exactly.
"""

import pytest
import torch

import decode
import sampling
import tiny_models
from test_decoding import decode_settings, mask_id_of, mask_loving, random_model, random_prompts

GAMMA = 1.5  # 1-4 reveals per forward on these random models


def test_blocks_of_one_are_next_token_decoding():
    m = random_model("gpt-tiny")
    prompts = random_prompts(m, 3, 5, seed=1)
    ntp, _ = tiny_models.ntp(m, prompts, 12, mask_id=mask_id_of(m))
    for b in range(3):
        tokens, stats = decode.sbd(m, prompts[b:b + 1], decode_settings(m, k=1, gamma=GAMMA), 12)
        assert tokens[0] == ntp[b], (
            "with k = 1 every block is its first token, which comes from the causal logits of the "
            "forward that commits what is pending (docs/method.md, 'The block's first token'): SBD "
            "must write greedy NTP's tokens")
        assert stats.nfe == [12], "one forward per block of one: 12 forwards for 12 tokens"


class AlwaysRight(torch.nn.Module):
    """A model whose causal logits are the real model's and whose block slots predict, with
    certainty, script[b][p] at position p: a drafter that is always right (script: per row, the
    prompt and greedy NTP's tokens)."""

    def __init__(self, inner, script):
        super().__init__()
        self.inner, self.script = inner, script
        self.config, self.max_seq_len = inner.config, inner.max_seq_len

    def new_cache(self, *args, **kwargs):
        return self.inner.new_cache(*args, **kwargs)

    def forward(self, idx, pos=None, mask=None, cache=None, n_commit=None, block_start=None):
        n_commit = idx.size(1) if n_commit is None else n_commit
        if pos is None:  # the model's own: the slots after the cached ones
            pos = torch.arange(cache.length, cache.length + idx.size(1))
        logits, loss = self.inner(idx, pos=pos, mask=mask, cache=cache, n_commit=n_commit)
        logits = logits.clone()
        for b, positions in enumerate(pos.expand(idx.size(0), -1).tolist()):  # (B, T)
            for i in range(n_commit, idx.size(1)):
                logits[b, i] = -1e4
                logits[b, i, self.script[b][positions[i]]] = 1e4
        return logits, loss


def test_a_drafter_that_is_always_right_fills_a_block_per_forward():
    m = random_model("gpt-tiny")
    prompts = random_prompts(m, 2, 5, seed=2)
    n, k = 24, 8
    ntp, _ = tiny_models.ntp(m, prompts, n, mask_id=mask_id_of(m))
    settings = decode_settings(m, k=k, gamma=sampling.ONE_FORWARD)
    for b in range(2):
        drafter = AlwaysRight(m, [prompts[b].tolist() + ntp[b]])  # a batch of one
        tokens, stats = decode.sbd(drafter, prompts[b:b + 1], settings, n)
        assert tokens[0] == ntp[b], (
            "block slot i stands for the token at its position (cache length + its index) and its "
            "logits predict that token: a drafter that is always right must give NTP's tokens")
        assert stats.nfe == [n // k], "everything revealed at once: one forward per block"


def test_decoding_goes_on_from_a_committed_block_as_from_a_prompt_that_holds_it():
    m = random_model("gpt-tiny")
    prompts = random_prompts(m, 2, 5, seed=3)
    k, settings = 4, decode_settings(m, k=4, gamma=GAMMA)
    for b in range(2):
        whole, _ = decode.sbd(m, prompts[b:b + 1], settings, 3 * k)
        held = torch.cat([prompts[b:b + 1], torch.tensor([whole[0][:k]])], dim=1)
        rest, _ = decode.sbd(m, held, settings, 2 * k)
        assert rest[0] == whole[0][k:], (
            "after a block is committed the cache must hold exactly what a prefill of the same "
            "tokens holds: the committed tokens' causal keys and values, and nothing of any "
            "block's bidirectional forwards")


def test_a_one_token_prompt_has_nothing_to_prefill():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 1)
    ntp, _ = tiny_models.ntp(m, prompt, 6, mask_id=mask_id_of(m))
    tokens, stats = decode.sbd(m, prompt, decode_settings(m, k=1, gamma=GAMMA), 6)
    assert tokens == ntp and stats.prefill_forwards == 0 and stats.tokens == [6], (
        "a one-token prompt: nothing to prefill, the token itself is what the first forward "
        "commits")


def test_a_row_stops_without_waiting_for_the_rest_of_its_block():
    m = random_model("gpt-tiny", seed=2)
    prompt = random_prompts(m, 1, 5, seed=2)
    plain, plain_stats = decode.sbd(m, prompt, decode_settings(m, k=16, gamma=GAMMA), 16)
    stop = plain[0][2]
    settings = decode_settings(m, k=16, gamma=GAMMA, stop_ids=[stop])
    tokens, stats = decode.sbd(m, prompt, settings, 16)
    assert tokens[0] == plain[0][:plain[0].index(stop) + 1], (
        "the row's tokens end at its first stop token, which it keeps")
    assert stats.nfe[0] < plain_stats.nfe[0], (
        "a stop token revealed with every position before it ends the row at once, even with "
        "masks left after it (docs/method.md, 'When a row stops')")


def test_the_last_block_is_cut_to_max_new_tokens():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 3)
    tokens, stats = decode.sbd(m, prompt, decode_settings(m, k=16, gamma=GAMMA), 21)
    assert len(tokens[0]) == 21 and stats.tokens == [21], (
        "blocks of k until max_new_tokens, never past it")
    assert stats.widths[0] == 1 + 16 and 16 + 5 in stats.widths, (
        "the first block's first forward feeds the pending prompt token and 16 slots; the "
        "second's feeds the first block and 21 - 16 = 5 slots")
    assert set(stats.widths) <= {1 + 16, 16, 16 + 5, 5}, "later forwards feed the block alone"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_mask_token_is_never_emitted(temperature):
    m = mask_loving(random_model("gpt-tiny"))
    prompt = random_prompts(m, 1, 4)
    assert (m(prompt)[0].argmax(-1) == mask_id_of(m)).all(), "the model prefers the mask token"
    settings = decode_settings(m, k=4, gamma=1.0, temperature=temperature, top_k=5)
    g = torch.Generator().manual_seed(0)
    tokens, _ = decode.sbd(m, prompt, settings, 12, generator=g)
    assert mask_id_of(m) not in tokens[0], "the mask token is an input only, never emitted"
    assert len(tokens[0]) == 12, "no stop token: max_new_tokens tokens"
