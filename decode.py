"""
Decoding one prompt, the reference: next-token decoding (NTP), Set Block Decoding (the paper's
Algorithms 2-3) and exact SBD, each one function on one screen (docs/method.md, Inference and Exact
mode). Batch 1 and eager. The rules every decoder shares are written here once: the block's first
token, when a row stops and the acceptance rule (the hybrid mask is sbd.hybrid_mask). serving/
decodes batches, compiled, by calling them, and gives the same tokens
(tests/test_reference_decoding.py).

Every decoder writes the prompt but its last token into a fresh KV cache with one causal forward
(the prefill, not counted) and keeps the last prompt token "pending": the first decode forward
feeds it, as every later forward feeds the newest tokens. Each returns ([the new ids up to and
including the first stop token], DecodeStats), as serving does for a batch.

    settings = DecodeSettings(mask_id=31, stop_ids=(30,), k=16, gamma=0.01)  # sampling.py
    tokens, stats = sbd(model, prompt, settings, max_new_tokens=64)  # prompt (1, T0)
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from sampling import greedy, next_token, reveal_step, sample, sampling_probs, suppress_mask
from sbd import block_predictions, hybrid_mask

# -----------------------------------------------------------------------------
# the decoders


@torch.inference_mode()
def ntp(model, prompt, settings, max_new_tokens, generator=None):
    """Next-token decoding: each forward feeds the newest token and yields the next (NFE = tokens).
    NTP uses the settings' stop tokens, mask token (never emitted) and sampling."""
    cache = model.new_cache(1, prompt.size(1) + max_new_tokens, prompt.device)
    pending = prefill(model, prompt, cache)  # (1, 1): the last prompt token
    out = []
    while not finished(out, settings, max_new_tokens):
        logits = model(pending, cache=cache)[0]  # (1, 1, V), causal: pending is committed
        pending = next_token(logits[:, -1], settings, generator)[:, None]  # (1, 1)
        out.append(int(pending))
    return result(out, [1] * len(out), prompt)


@torch.inference_mode()
def sbd(model, prompt, settings, max_new_tokens, generator=None):
    """Set Block Decoding: blocks of k masks. A block's first forward feeds [previous block ; block]
    and commits the previous block causally; its last causal logit gives block position 0 NTP's
    token (first_from_ntp), and the reveal rule reveals the others in this forward and later ones
    (fill). The row ends at a stop token with every position before it revealed."""
    cache = model.new_cache(1, prompt.size(1) + max_new_tokens, prompt.device)
    prev = prefill(model, prompt, cache)  # (1, 1): committed by the first forward
    out, widths = [], []
    while not finished(out, settings, max_new_tokens):
        k = min(settings.k, max_new_tokens - len(out))  # the last block is cut to fit
        block = prev.new_full((1, k), settings.mask_id)
        logits = hybrid_forward(model, cache, torch.cat([prev, block], dim=1), prev.size(1))
        widths.append(logits.size(1))  # logits: (1, n_prev + k, V)
        if settings.first_from_ntp:  # position 0: NTP's token, from prev's last causal logit
            block, _, _ = reveal_first(block, block == settings.mask_id,
                                       logits[:, :prev.size(1)], settings, generator)
        block, _ = fill(model, cache, block, logits[:, prev.size(1):], settings, generator, widths)
        out, prev = out + until_stop(block[0].tolist(), settings), block
    return result(out, widths, prompt)


@torch.inference_mode()
def exact(model, prompt, settings, max_new_tokens, generator=None):
    """Exact SBD: plain SBD's blocks are drafts, checked (accept) by the causal logits of the
    forward that commits them, so the output is NTP's (docs/method.md, Exact mode). The drafts
    before the first rejected one are kept, then NTP's token, which replaces the rejected draft
    (the cache forgets the rest, the new block is dropped) or starts the new block."""
    cache = model.new_cache(1, prompt.size(1) + max_new_tokens + 2 * settings.k, prompt.device)
    pending = prefill(model, prompt, cache)  # (1, 1 + n): a checked token, n drafts
    q, out, widths, accepted, rejected = None, [], [], 0, 0  # q (1, n, V): what drafts drew from
    while not finished(out, settings, max_new_tokens):
        n = pending.size(1) - 1
        ends = n > 0 and int(pending[0, -1]) in settings.stop_ids
        k = 0 if ends else min(settings.k, max_new_tokens - len(out) - n)  # the new block
        block = pending.new_full((1, k if k > 1 else 0), settings.mask_id)  # k = 1: NTP's alone
        logits = hybrid_forward(model, cache, torch.cat([pending, block], dim=1), n + 1)
        widths.append(logits.size(1))  # logits: (1, 1 + n + k, V)
        ok, targets = accept(pending[:, 1:], logits[:, :n + 1], q, settings, generator)
        kept = int(ok[0].long().cumprod(0).sum())  # the drafts before the first rejected one
        out += pending[0, 1:kept + 1].tolist()
        accepted, rejected = accepted + kept, rejected + n - kept
        if kept < n:  # NTP's token replaces the rejected draft; the cache forgets those after it
            cache.forget(0, n - kept)
            out, pending, q = out + [int(targets[0, kept])], targets[:, kept:kept + 1], None
        elif k:  # NTP's token starts the new block; the reveal rule drafts the others
            out.append(int(targets[0, n]))
            block, q = torch.cat([targets[:, n:], block[:, 1:]], dim=1), None  # (1, k)
            if k > 1 and not finished(out, settings, max_new_tokens):
                block, q = fill(model, cache, block, logits[:, n + 1:], settings, generator, widths)
            pending = block[:, :len(until_stop(block[0].tolist(), settings))]
            q = None if q is None else q[:, 1:pending.size(1)]  # (1, n, V): position 0 is NTP's
    return result(out, widths, prompt, accepted=[accepted], rejected=[rejected])


# -----------------------------------------------------------------------------
# Algorithm 3's loop, and the acceptance rule


def fill(model, cache, block, logits, settings, generator, widths):
    """Reveal block's (1, k) masks from its logits (1, k, V), then from forwards of the block alone,
    until none is left or a stop token has every slot before it revealed -> (block, q (1, k, V):
    what its tokens were drawn from, for exact SBD; None if greedy)."""
    stop = torch.tensor(settings.stop_ids, dtype=torch.long, device=block.device)
    is_masked, q_block = block == settings.mask_id, None  # (1, k)
    while True:
        logits = block_predictions(logits, settings.token_shift)  # position i: slot read_at(i)
        block, revealed, q = reveal_step(logits, block, is_masked, settings, generator)
        q_block = q if q_block is None else torch.where(revealed[..., None], q, q_block)
        is_masked = is_masked & ~revealed
        if not is_masked.any() or stop_reached(block, is_masked, stop):
            return block, q_block
        logits = hybrid_forward(model, cache, block, 0)  # (1, k, V)
        widths.append(block.size(1))


def accept(drafts, causal, q, settings, generator=None):
    """The acceptance rule: drafts (B, n), causal logits (B, n + 1, V), when sampling the drafts'
    distributions q (B, >= n, V; None: no drafts) -> (ok (B, n), targets (B, n + 1)). p is NTP
    sampling's own distribution (mask suppressed, filtered), so the output is NTP's."""
    if settings.temperature == 0:
        return accept_greedy(drafts, causal, settings.mask_id)
    p = sampling_probs(suppress_mask(causal, settings.mask_id), settings)  # (B, n + 1, V)
    q = p[:, :0] if q is None else q[:, :drafts.size(1)]
    return accept_sampled(drafts, q, p, generator)


def accept_greedy(drafts, causal, mask_id):
    """drafts (B, n), causal logits (B, n + 1, V) -> (ok (B, n) bool, targets (B, n + 1)).
    Draft j is kept iff it equals NTP's argmax after the slot before it; targets are NTP's tokens,
    the correction after the last kept draft and, if all are kept, the next block's first token."""
    targets = greedy(suppress_mask(causal, mask_id))  # (B, n + 1)
    return drafts == targets[:, :-1], targets


def accept_sampled(drafts, q, p, generator=None):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): drafts (B, n) drawn from q
    (B, n, V), p (B, n + 1, V) -> ok (B, n): draft x at j kept with probability min(1, p_j(x) /
    q_j(x)); targets (B, n + 1): at j < n a draw from norm(max(0, p_j - q_j)), at n from p_n."""
    B, n = drafts.shape
    p_x = p[:, :n].gather(-1, drafts[..., None])[..., 0]  # (B, n)
    q_x = q.gather(-1, drafts[..., None])[..., 0]
    u = torch.rand(B, n, generator=generator, device=drafts.device)
    ok = u * q_x < p_x  # P(ok) = min(1, p(x) / q(x))
    residual = (p[:, :n] - q).clamp(min=0)  # (B, n, V)
    empty = residual.sum(-1, keepdim=True) <= 0  # p == q there: a rejection cannot happen
    residual = torch.where(empty, p[:, :n], residual)
    targets = sample(torch.cat([residual, p[:, n:]], dim=1), generator)  # multinomial normalises
    return ok, targets


# -----------------------------------------------------------------------------
# the forward, and the rules of a block's first token and of its end


def hybrid_forward(model, cache, tokens, n_commit):
    """One forward of tokens (B, T) on the cache under sbd.hybrid_mask -> logits (B, T, V): the
    first n_commit (an int, or (B,) per row) causal and committed, the rest a block that is never
    committed. Each row's tokens go to its next slots (cache.lengths): a position is its slot."""
    q = cache.next_slots(tokens.size(1))  # (B, T): the slots
    start = (cache.lengths + n_commit)[:, None]  # (B, 1): the block's first slot
    mask = hybrid_mask(q[..., None], cache.slots, start[..., None])  # (B, T, max_len)
    mask &= cache.slots <= q[:, -1:, None]  # not the slots past the forward's (unwritten)
    return model(tokens, pos=q, mask=mask, cache=cache, n_commit=n_commit,
                 block_start=start)[0]  # a block adapter reads block_start (B, 1) too


def reveal_first(block, is_masked, causal, settings, generator=None):
    """Slot 0 of a new block gets the token NTP decoding would emit there: the committed prefix's
    last causal logit predicts exactly that position, and the block's first forward computes it.
    It costs none of the reveal rule's budget. -> (new block, is_masked, revealed (B, k) bool)"""
    revealed = F.pad(is_masked[:, :1], (0, block.size(1) - 1))  # (B, k): slot 0 where masked
    first = next_token(causal[:, -1], settings, generator)  # (B,)
    return torch.where(revealed, first[:, None], block), is_masked & ~revealed, revealed


def stop_reached(block, is_masked, stop):
    """(B,) bool: rows whose block holds a stop token with every position up to it revealed: such
    a row is finished, as what follows its stop token is cut anyway (it is often revealed first)."""
    prefix_revealed = is_masked.cumsum(dim=1) == 0  # (B, k): no mask at or before the slot
    return (torch.isin(block, stop) & prefix_revealed).any(dim=1)


# -----------------------------------------------------------------------------
# the small steps every decoder shares


def prefill(model, prompt, cache):
    """Write prompt[:-1] into the fresh KV cache with one causal forward (none for a one-token
    prompt) -> pending (B, 1): the last prompt token, which the first decode forward feeds."""
    if prompt.size(1) > 1:
        model(prompt[:, :-1], cache=cache)  # eager: a width that runs once per decode
    return prompt[:, -1:]


def finished(out, settings, max_new_tokens):
    """A row ends at its first stop token, which it keeps, or at max_new_tokens."""
    return len(out) >= max_new_tokens or bool(out) and out[-1] in settings.stop_ids


def until_stop(tokens, settings):
    """tokens (a list) up to and including the first stop token; all of them if there is none."""
    ends = [i + 1 for i, token in enumerate(tokens) if token in settings.stop_ids]
    return tokens[:ends[0]] if ends else tokens


# -----------------------------------------------------------------------------
# what a decode returns


@dataclass
class DecodeStats:
    """What one decode cost, per batch row. Counts include the stop token: it was generated too."""

    nfe: list  # decode forwards per row: forwards in which the row still had tokens to produce
    tokens: list  # tokens generated per row, up to and including the first stop token
    widths: list  # tokens fed per row by each decode forward of the batch (bench/ times them)
    prefill_forwards: int  # causal forwards over prompt[:-1] before decoding (0: 1-token prompt)
    accepted: list = None  # exact SBD only: drafts NTP confirmed
    rejected: list = None  # exact SBD only: drafts it rejected

    @property
    def tokens_per_forward(self):
        """Per row: tokens / decode forwards (1.0 for NTP; the NFE speed-up for SBD)."""
        return [t / max(n, 1) for t, n in zip(self.tokens, self.nfe)]


def result(out, widths, prompt, **counts):
    """-> ([out], DecodeStats) as serving returns for a batch of one; counts: exact SBD's."""
    return [out], DecodeStats(nfe=[len(widths)], tokens=[len(out)], widths=widths,
                              prefill_forwards=int(prompt.size(1) > 1), **counts)
