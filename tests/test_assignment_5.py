"""
Assignment 5 (block decoding): properties that every correct decoder has, on the GPT model only
(the Llama needs assignment 6). No reference decoder here (the grader's hidden tests have one):

- blocks of one are next-token decoding: the block's first token comes from the causal logits, so
  k = 1 leaves nothing to the reveal rule, and SBD is greedy NTP, one forward per token;
- a drafter that is always right fills a block per forward: a model whose block slots predict, with
  certainty, the token greedy NTP writes at their position decodes to NTP's tokens, one forward
  per block, when the rule reveals everything at once;
- decoding goes on from a committed block as from a prompt that holds it: after a block is
  committed, the cache holds what a prefill of the same tokens holds (a cache that kept a block's
  own keys, or lost a committed token, decodes differently);
- a one-token prompt has nothing to prefill.
Models are float64, so tokens compare exactly.
"""

import torch

import generate
import sampling
import tiny_models
from test_decoding import decode_settings, mask_id_of, random_model, random_prompts

GAMMA = 1.5  # 1-4 reveals per forward on these random models


def test_blocks_of_one_are_next_token_decoding():
    m = random_model("gpt-tiny")
    prompts = random_prompts(m, 3, 5, seed=1)
    ntp, _ = tiny_models.ntp(m, prompts, 12, mask_id=mask_id_of(m))
    tokens, stats = generate.sbd_generate(m, prompts, decode_settings(m, k=1, gamma=GAMMA), 12)
    assert tokens == ntp, (
        "with k = 1 every block is its first token, which comes from the causal logits of the "
        "forward that commits what is pending (docs/method.md, 'The block's first token'): SBD "
        "must write greedy NTP's tokens")
    assert stats.nfe == [12] * 3, "one forward per block of one: 12 forwards for 12 tokens"


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
    script = [prompts[b].tolist() + ntp[b] for b in range(2)]
    settings = decode_settings(m, k=k, gamma=sampling.ONE_FORWARD)
    tokens, stats = generate.sbd_generate(AlwaysRight(m, script), prompts, settings, n)
    assert tokens == ntp, (
        "block slot i stands for the token at its position (cache length + its index) and its "
        "logits predict that token: a drafter that is always right must give NTP's tokens")
    assert stats.nfe == [n // k] * 2, "everything revealed at once: one forward per block"


def test_decoding_goes_on_from_a_committed_block_as_from_a_prompt_that_holds_it():
    m = random_model("gpt-tiny")
    prompts = random_prompts(m, 2, 5, seed=3)
    k, settings = 4, decode_settings(m, k=4, gamma=GAMMA)
    whole, _ = generate.sbd_generate(m, prompts, settings, 3 * k)
    first_block = torch.tensor([row[:k] for row in whole])
    rest, _ = generate.sbd_generate(m, torch.cat([prompts, first_block], dim=1), settings, 2 * k)
    assert rest == [row[k:] for row in whole], (
        "after a block is committed the cache must hold exactly what a prefill of the same tokens "
        "holds: the committed tokens' causal keys and values, and nothing of any block's "
        "bidirectional forwards")


def test_a_one_token_prompt_has_nothing_to_prefill():
    m = random_model("gpt-tiny")
    prompt = random_prompts(m, 1, 1)
    ntp, _ = tiny_models.ntp(m, prompt, 6, mask_id=mask_id_of(m))
    tokens, stats = generate.sbd_generate(m, prompt, decode_settings(m, k=1, gamma=GAMMA), 6)
    assert tokens == ntp and stats.prefill_forwards == 0 and stats.tokens == [6], (
        "a one-token prompt: nothing to prefill, the token itself is what the first forward "
        "commits")
