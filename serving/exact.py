"""
Exact SBD for serving: batches whose rows keep different numbers of drafts, the adaptive block
size, the draft floor and the step view. decode.py:exact is the same method for one prompt, on one
screen, and holds the rules this file calls (decode.accept, decode.stop_reached); docs/method.md,
Exact mode.

The forward that commits a block (the first forward of the next block) computes, for every token
of it, the causal logits of the position before: exactly what NTP decoding computes there. So it
checks the block's drafts for free, like speculative decoding with the model's own masked-token
predictions as the draft model:
  - greedy (temperature 0): a draft must equal the argmax of the causal logits before it; sampling:
    a draft x drawn from q is kept with probability min(1, p(x) / q(x)), p the causal distribution;
  - at the first rejected draft: keep the drafts before it, emit NTP's token instead (the argmax,
    or a draw from norm(max(0, p - q))), forget the cache from there on, throw away the new block
    (its drafts were conditioned on the wrong token) and start the next block after the correction;
  - a block's first token is NTP's own (the committed prefix's last causal logit), and the block
    that ends a row gets one more forward that only checks it.
So the greedy output is greedy NTP's, token for token, and the sampled output is distributed as NTP
sampling's; γ and the block size only trade forwards on rejected drafts against tokens per forward.

Rows of a batch keep different numbers of drafts, so each row has its own cache length (the static
cache's lengths, model.KVCache), and all rows run their forwards in lockstep: a forward feeds every
row's pending tokens and block, one after the other, padded at the end to the widest row, and its
mask (serving.batched.cache_mask) hides the padding.

    tokens, stats = exact_generate(model, prompts, DecodeSettings(mask_id=31, exact=True), 64)
"""

import functools
import time

import torch
from torch.nn import functional as F

import decode as reference
from decode import accept, stop_reached
from sampling import ONE_FORWARD, greedy, reveal_step, suppress_mask
from sbd import block_predictions, read_at
from serving.batched import (
    Check,
    ServingStats,
    Step,
    check_mask_id,
    check_prompt,
    decode_forward,
    new_cache,
    ntp_generate,
    ntp_run,
    prefill,
    sbd_generate,
    warm_up,
)
from serving.layout import fastest_setup, lay_out_for_decoding
from serving.settings import serving_settings

MAX_PATIENCE = 64  # adaptive block size: the longest wait at k = 1 before trying drafts again


# -----------------------------------------------------------------------------
# the adaptive block size


def next_block_size(k, n_drafts, n_ok, patience, wait, max_k):
    """Adaptive block size of one row after a check of n_drafts drafts, n_ok of them kept.

    Rule: a row's first block has 2 slots (patience 0: no evidence yet), and if its draft is kept
    the next has max_k: a first block of max_k would cost two wide forwards on a model whose drafts
    all fail, and one forward of 2 slots is all that starting small costs one that drafts well.
    After that, every draft kept -> the block doubles (at most max_k); some kept, then one
    rejected -> the block stays (a forward of a few more slots costs little, and smaller blocks
    than trained on draft worse); none kept -> blocks of 1: plain NTP, one token fed per forward
    and nothing drafted (ntp_step). Such a row tries k = 2 again after `patience` blocks; its
    patience quadruples after each failed try (up to MAX_PATIENCE) and resets once drafts survive,
    as dynamic draft lengths in speculative decoding back off. Returns (k, patience, wait)."""
    if n_drafts == 0:  # nothing to judge by: a block of 1 waits for its next try
        wait = max(wait - 1, 0)
        return (min(2, max_k) if k == 1 and wait == 0 else k), patience, wait
    if n_ok == n_drafts:
        return (max_k if patience == 0 else min(2 * k, max_k)), 1, 0
    if n_ok == 0:
        return 1, min(4 * max(patience, 1), MAX_PATIENCE), max(patience, 1)
    return k, max(patience, 1), 0


# -----------------------------------------------------------------------------
# the decoder


class Rows:
    """Each row's state between forwards: host lists, and tensors for the blocks being drafted
    (none when on_host). Its methods are the decoder's steps: check a forward, draft, finish."""

    def __init__(self, prompt, settings, max_new_tokens, vocab_size, tensor_state=False):
        B, max_k, device = prompt.size(0), settings.k, prompt.device
        if settings.adaptive:  # the block size sets how much is drafted: every slot in one forward
            settings = settings.replace(gamma=ONE_FORWARD)
        self.settings, self.max_new_tokens, self.max_k = settings, max_new_tokens, max_k
        # greedy drafts of a whole block per forward: the argmaxes are a row's whole state, kept in
        # host lists (update_on_host); else, and with tensor_state (the step view), in tensors
        self.on_host = settings.temperature == 0 and settings.gamma >= ONE_FORWARD
        self.on_host &= not tensor_state
        self.stop = torch.tensor(settings.stop_ids, dtype=torch.long, device=device)
        self.out, self.done = [[] for _ in range(B)], [False] * B  # checked tokens; row done
        self.pending = [[t] for t in prompt[:, -1].tolist()]  # to commit: checked token, drafts
        self.pending_revealed_by = [[] for _ in range(B)]  # forward of its block, per pending slot
        # the block size's state (adaptive: a first block of 2, patience 0: next_block_size)
        first = min(2, max_k) if settings.adaptive else max_k
        self.k, self.patience, self.wait = [first] * B, [0] * B, [0] * B
        self.block_len = [0] * B  # slots of the block being drafted (0: the next forward checks)
        self.block_start = [0] * B  # index of the block's first token among the row's tokens
        self.block = torch.full((B, max_k), settings.mask_id, device=device)  # (B, max_k)
        self.is_masked = torch.zeros(B, max_k, dtype=torch.bool, device=device)
        self.slots = torch.arange(max_k, device=device)  # (max_k,)
        self.revealed_by = torch.full((B, max_k), -1, device=device)  # forward, per slot
        self.confident = torch.ones(B, max_k, dtype=torch.bool, device=device)  # worth checking
        self.forwards = torch.zeros(B, 1, dtype=torch.long, device=device)  # of the current block
        self.q = self.q_pending = None  # sampling: (B, max_k, V) the draws' distributions
        if settings.temperature > 0:
            self.q = torch.zeros(B, max_k, vocab_size, device=device)
            self.q_pending = torch.zeros(B, max_k - 1, vocab_size, device=device)
        self.stats = {name: [0] * B for name in
                      ("nfe", "accepted", "rejected", "wasted_forwards", "final_checks",
                               "unchecked")}
        for b in range(B):
            self.new_block(b)

    def block_size(self, b):
        """Slots of row b's next block: 0 if its pending tokens end the row."""
        pending = self.pending[b]
        room = self.max_new_tokens - len(self.out[b]) - (len(pending) - 1)
        last = len(pending) > 1 and pending[-1] in self.settings.stop_ids or room == 0
        return 0 if last else min(self.k[b], room)

    def new_block(self, b):
        """Row b's next block: masks after its pending tokens, or none if they end the row."""
        self.block_len[b] = self.block_size(b)
        if self.on_host:  # the block tensor stays all masks: fed to the model, never drafted into
            return
        self.block[b] = self.settings.mask_id
        self.is_masked[b] = self.slots < self.block_len[b]
        self.revealed_by[b], self.forwards[b], self.confident[b] = -1, 0, True

    def block_width(self, b):
        """Block slots row b feeds next: none if it only checks or commits into a 1-slot block."""
        only_checks = self.done[b] or self.pending[b] and self.block_len[b] == 1
        return 0 if only_checks else self.block_len[b]

    def emit(self, b, tokens):
        """Checked tokens of row b; the row is done at a stop token or at max_new_tokens."""
        for t in tokens:
            if not self.done[b]:
                self.out[b].append(t)
                self.done[b] = (t in self.settings.stop_ids
                                or len(self.out[b]) == self.max_new_tokens)

    def check(self, cache, pending, causal, n_prev, generator):
        """Check what each row's forward committed. -> per row: its Check (None: nothing
        committed), whether it rejected a draft, whether its new block's slot 0 was revealed.

        pending (B, P): each row's checked token then its drafts, padded; causal (B, P, V)."""
        ok, targets = accept(pending[:, 1:], causal, self.q_pending, self.settings,
                            generator)  # draft j: causal slot j
        n_drafts, P = [max(n - 1, 0) for n in n_prev], pending.size(1)
        both = torch.cat([ok, targets], dim=1).tolist()  # one transfer: (B, 2P - 1)
        n_ok = [leading_true(row[:n]) for row, n in zip(both, n_drafts)]
        return self.commit(cache, n_prev, n_ok, [row[P - 1:] for row in both])

    def commit(self, cache, n_prev, n_ok, targets):
        """What each row's check decided: keep its first n_ok[b] drafts, then NTP's token
        targets[b][n_ok[b]] (a correction, or its new block's first token). -> as check's."""
        n_drafts = [max(n - 1, 0) for n in n_prev]
        checks, rejected, first = [None] * len(n_prev), [False] * len(n_prev), [False] * len(n_prev)
        for b in (b for b in range(len(n_prev)) if n_prev[b]):
            a, n, drafted = n_ok[b], n_drafts[b], self.pending[b][1:]
            checks[b] = Check(len(self.out[b]), drafted[:a], drafted[a:], None)
            self.stats["accepted"][b] += a
            self.stats["final_checks"][b] += self.block_len[b] == 0
            self.emit(b, drafted[:a])
            if self.settings.adaptive:
                self.k[b], self.patience[b], self.wait[b] = next_block_size(
                    self.k[b], n, a, self.patience[b], self.wait[b], self.max_k)
            if a < n:  # draft a is wrong: NTP's token replaces it, the new block is dropped
                cache.forget(b, n - a)
                self.stats["rejected"][b] += n - a
                self.stats["wasted_forwards"][b] += wasted(self.pending_revealed_by[b], a)
                checks[b].correction = targets[b][a]
                self.emit(b, [targets[b][a]])
                self.pending[b], rejected[b] = [targets[b][a]], True
                self.new_block(b)
            elif self.block_len[b] == 0:  # the row's last block checked out
                self.done[b] = True
            else:  # the new block's first token is NTP's own: checked as it is made
                if not self.on_host:
                    self.block[b, 0], self.is_masked[b, 0] = targets[b][n], False
                    self.revealed_by[b, 0] = 0
                self.block_start[b], first[b] = len(self.out[b]), True
                self.emit(b, [targets[b][n]])
                self.pending[b] = []
        return checks, rejected, first

    def draft(self, logits, drafting, generator):
        """The reveal rule on the rows still drafting (a list of bools); logits (B, W, V) of the
        first W block slots. -> revealed (B, W) bool, or None when no row drafts."""
        W = logits.size(1)
        if not any(drafting):  # a drafting row always has a masked slot: no sync to ask
            return None
        # (B, 1) flags, or True when every row drafts (no tensor to make, as always at batch 1)
        drafting = True if all(drafting) else torch.tensor(drafting, device=logits.device)[:, None]
        masked = self.is_masked[:, :W] & drafting
        block, revealed, q = reveal_step(logits, self.block[:, :W], masked, self.settings,
                                         generator)
        if q is not None:  # keep each draw's distribution q for the acceptance rule
            self.q[:, :W] = torch.where(revealed[..., None], q, self.q[:, :W])
        self.block[:, :W] = block
        self.is_masked[:, :W] &= ~revealed
        self.revealed_by[:, :W] = torch.where(revealed, self.forwards, self.revealed_by[:, :W])
        if self.settings.min_draft_prob:
            logits = suppress_mask(logits, self.settings.mask_id)
            confident = confident_drafts(logits, self.settings)
            self.confident[:, :W] = torch.where(revealed, confident, self.confident[:, :W])
        self.forwards += drafting  # forwards of each row's block
        return revealed

    def finish_blocks(self, candidates):
        """Rows among candidates whose block is complete (no mask left, or a stop token with every
        slot before it revealed) make it their pending tokens and start the next block."""
        complete = stop_reached(self.block, self.is_masked, self.stop) | ~self.is_masked.any(1)
        state = torch.cat([complete[:, None], self.block, self.revealed_by, self.confident],
                          dim=1).tolist()  # one transfer: flag, block, by, confident
        complete = [b for b in candidates if state[b][0]]
        if self.q is not None and complete:
            self.q_pending[complete] = self.q[complete, 1:]
        max_k, block_len = self.max_k, self.block_len
        for b in complete:  # the row's block_len slots of each
            block, by, confident = (state[b][1 + i * max_k:1 + i * max_k + block_len[b]]
                                    for i in range(3))
            self.finish_block(b, block, by, confident)

    def finish_block(self, b, block, revealed_by, confident):
        """Row b's drafted block (its block_len[b] tokens) becomes its pending tokens, up to a stop
        token and before the first draft the head is unsure of (confident: per position;
        min_draft_prob)."""
        n_keep = next((i for i, t in enumerate(block) if t in self.settings.stop_ids),
                      len(block) - 1)
        n_confident = leading_true(confident[1:n_keep + 1])  # position 0 is NTP's own token
        self.stats["unchecked"][b] += n_keep - n_confident
        n_keep = n_confident
        if self.q_pending is not None:  # no draft after the kept ones: the token after them is
            self.q_pending[b, n_keep:] = 0  # drawn from p (the residual of p - 0), not from p - q
        self.pending[b], self.pending_revealed_by[b] = block[:n_keep + 1], revealed_by
        self.new_block(b)

    def update(self, cache, logits, pending, n_prev, block_widths, generator=None, record=False):
        """Check, draft and finish blocks after a forward of pending (B, P) and W block slots,
        logits (B, P + W, V) (lockstep_forward's outputs) -> its Step if record, else None."""
        if self.on_host:
            return self.update_on_host(cache, logits, n_prev)
        B, P = len(n_prev), pending.size(1)
        # the rows drafting before the checks
        active = [b for b in range(B) if not self.done[b] and self.block_len[b]]
        checks, rejected, first = self.check(cache, pending, logits[:, :P], n_prev, generator)
        drafting = [b in active and not self.done[b] and not rejected[b] and block_widths[b] > 0
                    for b in range(B)]
        block_logits = block_predictions(logits[:, P:], self.settings.token_shift)  # by position
        revealed = self.draft(block_logits, drafting, generator)
        step = self.step_record(revealed, first, checks, rejected, active) if record else None
        self.finish_blocks([b for b in active if not self.done[b] and not rejected[b]])
        return step

    def update_on_host(self, cache, logits, n_prev):
        """update for greedy drafts of whole blocks (on_host): one argmax and one transfer; the
        causal slots give NTP's tokens (the check), the block slots the drafts (the reveal)."""
        P, s = max(n_prev), self.settings
        logits = suppress_mask(logits, s.mask_id)
        tokens = greedy(logits).tolist()  # (B, P + W)
        W = logits.size(1) - P
        confident = (confident_drafts(block_predictions(logits[:, P:], s.token_shift), s).tolist()
                if s.min_draft_prob else [[True] * W] * len(n_prev))  # (B, W) by position
        n_ok = [leading_true([d == t for d, t in zip(p[1:], row)]) if n else 0
                for p, row, n in zip(self.pending, tokens, n_prev)]  # draft j: causal slot j
        _, _, first = self.commit(cache, n_prev, n_ok, tokens)
        for b in (b for b in range(len(n_prev)) if first[b] and not self.done[b]):
            block_len, shift = self.block_len[b], s.token_shift
            # position 0 is NTP's token, just emitted; position i's draft is at slot read_at(i)
            drafts = tokens[b][P + read_at(1, shift):P + read_at(block_len, shift)]
            self.finish_block(b, self.out[b][-1:] + drafts, [0] * block_len,
                              confident[b][:block_len])

    def step_record(self, revealed, first, checks, rejected, active):
        """The Step of one forward, for the step view: each row's block after it (empty for a row
        that only checked or whose new block was dropped), what it revealed, and its Check."""
        shown = torch.zeros_like(self.is_masked)  # (B, max_k): the reveal rule's, NTP's slot 0
        if revealed is not None:
            shown[:, :revealed.size(1)] = revealed
        shown[:, 0] |= torch.tensor(first, device=shown.device)
        block_len = [self.block_len[b] if b in active and not rejected[b] else 0
                     for b in range(len(self.out))]
        tokens = [self.block[b, :n].cpu().clone() for b, n in enumerate(block_len)]
        shown = [shown[b, :n].cpu() for b, n in enumerate(block_len)]
        return Step(list(self.block_start), tokens, shown, checks)


def confident_drafts(block_logits, settings):
    """(B, W, V) logits of block positions, the mask token suppressed -> (B, W) bool: the
    masked-token head's largest probability there is at least settings.min_draft_prob. Drafts
    from the first unsure one on are not checked: a block of drafts likely kept is cheaper to
    check than a longer one whose rejection throws the next block away. The test reads the head's
    distribution, not the token drawn from it, so a cut block keeps exact sampling exact."""
    probs = F.softmax(block_logits.float(), dim=-1)
    return probs.amax(-1) >= settings.min_draft_prob


def leading_true(flags):
    """How many of a row's checks pass before the first that fails: its drafts kept."""
    return next((j for j, ok in enumerate(flags) if not ok), len(flags))


def wasted(revealed_by, n_ok):
    """Forwards of a rejected block whose every reveal was thrown away: each revealed only slots
    after the kept slots 0..n_ok (a rejected draft, or a slot cut after the stop token)."""
    every = {f for f in revealed_by if f >= 0}
    return len(every - {f for f in revealed_by[:n_ok + 1] if f >= 0})


@torch.inference_mode()
def exact_generate(model, prompt, settings, max_new_tokens, generator=None, record_steps=False):
    """Exact SBD decoding of a batch: each row's output is NTP decoding's of that row alone.

    prompt (B, T0), rows of equal length; settings.exact need not be set. Every forward feeds, per
    row, its pending tokens (a checked token and the drafts to check) and its block (k slots to
    draft, or the block alone in the block's later forwards), padded to the batch's widest; rows
    all at blocks of 1 take NTP's step. Greedy at temperature 0; sampling needs settings.rule =
    'left' (docs/method.md, Exact sampling). -> (tokens, stats) as sbd_generate's, with per-row
    accepted, rejected, wasted_forwards (all reveals rejected), final_checks (only checked)."""
    settings = serving_settings(settings)
    check_mask_id(model, settings)
    prompt = check_prompt(model, prompt, max_new_tokens)
    t0 = time.perf_counter()
    cache = new_cache(model, prompt, max_new_tokens, settings)  # and 2k of room
    _, prefill_info = prefill(model, prompt, cache)
    rows = Rows(prompt, settings, max_new_tokens, model.config.vocab_size,
                tensor_state=record_steps)
    widths, steps = [], []  # steps: each forward's Step, or None when not recorded
    while not all(rows.done):
        n = 0 if record_steps else ntp_step(model, cache, rows, generator)  # blocks of 1: NTP's
        if n:
            widths += [1] * n
            continue
        logits, pending, n_prev, block_widths = lockstep_forward(model, cache, rows)
        widths.append(logits.size(1))
        steps.append(rows.update(cache, logits, pending, n_prev, block_widths, generator,
                                 record_steps))
    stats = ServingStats(tokens=[len(out) for out in rows.out], widths=widths,
                         steps=steps if record_steps else None,
                         wall_time=time.perf_counter() - t0, **rows.stats, **prefill_info)
    return rows.out, stats


def ntp_step(model, cache, rows, generator):
    """If every row is at blocks of 1 with no draft to check (adaptive; k = 1): NTP's own loop up
    to a row's next try at drafting, with the lockstep path's tokens, draws, stats. -> forwards."""
    if any(rows.done) or any(n != 1 or len(p) != 1 for n, p in zip(rows.block_len, rows.pending)):
        return 0
    n = min(rows.max_new_tokens - len(out) for out in rows.out)  # no row past its budget
    # adaptive: a row waiting w more blocks tries k = 2 after its w-th token
    n = min([n] + [max(w, 1) for w in rows.wait]) if rows.settings.adaptive else n
    pending = torch.tensor(rows.pending, device=rows.block.device)  # (B, 1)
    tokens, nfe = ntp_run(model, cache, pending, rows.settings, rows.stop, n, generator)
    for b, (row, n_fed) in enumerate(zip(tokens.tolist(), nfe.tolist())):
        rows.stats["nfe"][b] += n_fed
        for token in row[:n_fed]:
            if rows.settings.adaptive:  # a check of no drafts: one block nearer the next try
                rows.k[b], rows.patience[b], rows.wait[b] = next_block_size(
                    rows.k[b], 0, 0, rows.patience[b], rows.wait[b], rows.max_k)
            rows.block_start[b] = len(rows.out[b])
            rows.emit(b, [token])
        rows.pending[b], rows.pending_revealed_by[b] = [row[-1]], [0]
        if rows.block_size(b) != 1:  # its blocks grow: the block tensors start the new one
            rows.new_block(b)
    return tokens.size(1)


def lockstep_forward(model, cache, rows):
    """One forward of every row's pending tokens and block -> logits (B, P + W, V) of the padded
    layout [pending (B, P) ; block (B, W)], pending (B, P), n_prev and block_widths per row. Each
    row feeds its own tokens one after the other, at its own cache slots, padded at the end to the
    widest row (the mask hides the padding, serving.batched.cache_mask); its logits are put back
    in that layout."""
    n_prev = [0 if done else len(p) for done, p in zip(rows.done, rows.pending)]
    block_widths = [rows.block_width(b) for b in range(len(n_prev))]
    P, W, mask_id = max(n_prev), max(block_widths), rows.settings.mask_id
    device = rows.block.device
    pending = torch.tensor([p + [mask_id] * (P - len(p)) if n else [mask_id] * P
                            for p, n in zip(rows.pending, n_prev)], dtype=torch.long, device=device)
    tokens = torch.cat([pending, rows.block[:, :W]], dim=1)  # (B, P + W)
    if len(set(n_prev)) == len(set(block_widths)) == 1:  # always at batch 1: no row has padding
        logits = decode_forward(model, cache, tokens, P)  # plain SBD's forward
    else:  # row b: its n_prev pending tokens, its block slots, then the padding slots
        order = torch.tensor([[*range(n), *range(P, P + f), *range(n, P), *range(P + f, P + W)]
                              for n, f in zip(n_prev, block_widths)], device=device)  # (B, P + W)
        n_real = [n + f for n, f in zip(n_prev, block_widths)]
        logits = decode_forward(model, cache, tokens.gather(1, order),
                                torch.tensor(n_prev, device=device),
                                torch.tensor(n_real, device=device))
        back = order.argsort(dim=1)[..., None].expand(-1, -1, logits.size(-1))  # (B, P + W, V)
        logits = logits.gather(1, back)
    for b in range(len(n_prev)):
        rows.stats["nfe"][b] += bool(n_prev[b] or block_widths[b])
    return logits, pending, n_prev, block_widths


def decode(model, prompt, settings, max_new_tokens, ntp=False, generator=None, record_steps=False):
    """Decode prompts as the settings say -> (token lists, ServingStats): NTP with ntp=True (the
    baseline, with the settings' stop and mask tokens and sampling; it records no steps), else
    exact or plain SBD."""
    if ntp:
        return ntp_generate(model, prompt, settings, max_new_tokens, generator)
    run = exact_generate if settings.exact else sbd_generate
    return run(model, prompt, settings, max_new_tokens, generator, record_steps)


def decoders(model, settings, prompt, max_new_tokens, compile, weights, quantized_rows, four_bit,
             as_loaded, record_steps=False):
    """sample.py's decoders of prompt (B, T0) -> (model, settings, SBD's decoder, NTP's):
    decode.py's on the model as trained, or decode()'s (the same tokens) where a setting needs
    serving: compiled graphs (compile; None: what fastest_setup picks; every width compiled here
    for decodes of up to max_new_tokens), int8/int4 weights ('auto': a GGUF file's 4-bit blocks,
    four_bit, for a model as loaded only: a fine-tune's weights are off the file's grid, and
    quantizing them again would decode another model than the one trained), the step view
    (record_steps), adaptive blocks, the draft floor. Serving's model has its weights laid out
    once for decoding (serving/layout.py)."""
    compile, weights = fastest_setup(model, compile, weights, four_bit and as_loaded)
    settings = serving_settings(settings, compiled=compile)
    print(f"decoding: {weights} weights ({next(model.parameters()).dtype}), "
          + ("compiled" if compile else "eager"))
    if not (settings.needs_serving() or weights != "trained" or record_steps):
        return model, settings, reference.exact if settings.exact else reference.sbd, reference.ntp
    model = lay_out_for_decoding(model, next(model.parameters()).dtype, weights, quantized_rows,
                                 four_bit)
    if compile:
        print(f"compile: {warm_up(model, prompt, max_new_tokens, settings):.1f} s")
    return (model, settings, functools.partial(decode, record_steps=record_steps),
            functools.partial(decode, ntp=True))
