"""
Decoding with a static KV cache, for a GPU: every decode forward of one width has the same shapes
and reads the same buffers, so torch.compile(mode="reduce-overhead") can record it once as a CUDA
graph and replay it, instead of paying Python's kernel launches every token (gpt-fast's recipe).

The dynamic cache (model.KVCache) attends over the slots filled so far, a view whose length grows
by one each token: a new shape every step. StaticCache attends over the whole buffer every time and
hides the slots not filled yet with the mask; positions and the slots to write are tensors, not
Python ints. The tokens are the same as the dynamic path's: tests/test_static.py checks that on a
CPU (where compiling buys little); python -m bench.gpu --static=True times it on a GPU.
bench/fast_decode.py is the CPU counterpart for Llama: the same static cache, per layer, with the
weights laid out once for inductor (python -m bench.fast_bench times it against llama.cpp).

    tokens = static_ntp_generate(model, prompt, max_new_tokens=64, compile=True)
"""

import torch

from generate import check_prompt
from sampling import pick_tokens, suppress_mask
from sbd import hybrid_mask


class StaticCache:
    """The model's KV buffers (B, n_kv_head, max_len, head_dim) per layer, always read whole.

    A forward writes its T new keys and values at the slots `self.slots` (a (T,) tensor the caller
    sets) and attends over all max_len slots; the caller's mask hides what is not there yet.
    """

    def __init__(self, model, batch_size, max_len, device, dtype):
        cache = model.new_cache(batch_size, max_len, device, dtype)
        self.k, self.v, self.max_len = cache.k, cache.v, max_len
        self.slots = None

    def extend(self, layer, k_new, v_new, n_commit):
        self.k[layer].index_copy_(2, self.slots, k_new)  # (B, H, max_len, hd), in place
        self.v[layer].index_copy_(2, self.slots, v_new)
        return self.k[layer], self.v[layer]

    def commit(self, n):
        """Nothing to count: what is committed is what the caller's positions say."""


def step_inputs(cache, first_slot, T, block_start=None):
    """Positions (T,) and mask (T, max_len) of T tokens written from slot first_slot (a 0-dim
    tensor): causal, or with block_start the hybrid mask of a block after a committed prefix."""
    # generate.hybrid_forward's mask, over the whole buffer: a CUDA graph replays fixed shapes only
    device = first_slot.device
    pos = first_slot + torch.arange(T, device=device)  # (T,)
    kv = torch.arange(cache.max_len, device=device)  # (max_len,)
    start = pos[0] + T if block_start is None else first_slot + block_start
    mask = hybrid_mask(pos[:, None], kv[None, :], start) & (kv[None, :] <= pos[-1])  # (T, max_len)
    cache.slots = pos
    return pos, mask


def forward_fn(model):
    """One static-shape forward: (tokens (B, T), pos (T,), mask (T, max_len), cache) -> logits."""

    def forward(tokens, pos, mask, cache):
        logits, _ = model(tokens, pos=pos, mask=mask, cache=cache)
        return logits

    return forward


@torch.inference_mode()
def static_ntp_generate(model, prompt, max_new_tokens, mask_id=None, compile=False):
    """Greedy next-token decoding on a StaticCache -> token lists, as generate.ntp_generate's
    (no stop tokens: a compiled loop runs a fixed number of steps)."""
    prompt = check_prompt(model, prompt, max_new_tokens)
    B, T0 = prompt.shape
    device, dtype = prompt.device, next(model.parameters()).dtype
    cache = StaticCache(model, B, T0 + max_new_tokens, device, dtype)
    forward = forward_fn(model)
    step = torch.compile(forward, mode="reduce-overhead", fullgraph=True) if compile else forward
    slot = torch.zeros((), dtype=torch.long, device=device)
    if T0 > 1:  # the prefill: one forward over prompt[:-1] (its width runs once: not compiled)
        pos, mask = step_inputs(cache, slot, T0 - 1)
        forward(prompt[:, :-1], pos, mask, cache)
        slot = slot + (T0 - 1)
    pending, out = prompt[:, -1:], []
    for _ in range(max_new_tokens):
        pos, mask = step_inputs(cache, slot, 1)
        logits = step(pending, pos, mask, cache)  # (B, 1, V)
        pending = pick_tokens(suppress_mask(logits, mask_id)).clone()  # (B, 1), outside the graph
        out.append(pending)
        slot = slot + 1
    return torch.cat(out, dim=1).tolist()
