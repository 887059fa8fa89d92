"""
Set Block Decoding (Gat et al., arXiv:2509.04185): everything that is specific to the method.

Training: one forward over [clean x_1..x_L ; noisy x̂_1..x̂_L] (length 2L, position ids [0..L-1, 0..L-1]),
where the clean half is ordinary next-token prediction and the noisy half learns to fill masked tokens of
a block of k from the causal prefix and the block's revealed tokens (Eq. 14 of the paper).
Decoding: each block of k starts as k mask tokens; every forward predicts all masked positions at once and
reveals the ones that are safe to reveal together (EB-Sampler, Eq. 8); the KV cache stays exact because
only causally processed tokens are ever written to it.

Index convention: 0-based throughout; SBD.md's 1-based x_1..x_L is x[0]..x[L-1] here.
"""

import time
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from model import IGNORE_INDEX, block_mask, causal_mask, dense_mask

# -----------------------------------------------------------------------------
# attention masks: pure functions of (query slot, key slot)


def block_id(i, k_block, phase):
    """Block of noisy position i when blocks of k_block start at positions phase, phase ± k_block, ...

    phase lets blocks start where decoding blocks start (e.g. at the first answer token) instead of at 0.
    """
    return torch.div(i - phase, k_block, rounding_mode="floor")


def sbd_training_mask(q, k, L, k_block, phase=0, noisy_start=0):
    """Attention mask of the training sequence [clean 0..L-1 ; noisy L..] (True = may attend).

    Noisy slot L + j is the noisy copy of position noisy_start + j (noisy_start > 0: see first_noisy_position).

    In the paper's notation, with b(i) the block of noisy position i and s(i) = its block's first position:
      clean query i -> clean key j     iff j <= i                    (causal, plain NTP)
      noisy query i -> clean key j     iff j < s(i)                  (the clean prefix before its block)
      noisy query i -> noisy key j     iff b(j) == b(i)              (bidirectional inside its own block)
      clean query   -> noisy key       never                        (NTP must not see the noisy half)
    The k=4 example, L=8, phase 0 (c = clean, n = noisy, 1 = may attend):
                 c0 c1 c2 c3 c4 c5 c6 c7 | n0 n1 n2 n3 n4 n5 n6 n7
        c0..c7   lower triangle          | 0
        n0..n3   0  0  0  0  0  0  0  0  | 1  1  1  1  0  0  0  0
        n4..n7   1  1  1  1  0  0  0  0  | 0  0  0  0  1  1  1  1
    """
    q_noisy, k_noisy = q >= L, k >= L
    qi, ki = q - (L - noisy_start) * q_noisy, k - (L - noisy_start) * k_noisy  # positions in the sequence
    q_block = block_id(qi, k_block, phase)
    block_start = q_block * k_block + phase
    clean_clean = ~q_noisy & ~k_noisy & (ki <= qi)
    noisy_clean = q_noisy & ~k_noisy & (ki < block_start)
    noisy_noisy = q_noisy & k_noisy & (block_id(ki, k_block, phase) == q_block)
    return clean_clean | noisy_clean | noisy_noisy


def hybrid_mask(q, k, block_start):
    """Decoding mask over [prefix ; block]: causal up to block_start, then a bidirectional block.

    Slots < block_start (prompt, cache, a block being committed) attend causally; the block's slots attend to
    every prefix slot and to each other. With a KV cache the prefix is [cache ; committed previous block].
    k=4 block after a 3-token prefix (block_start = 3):
        q0: 1 0 0 | 0 0 0 0
        q1: 1 1 0 | 0 0 0 0
        q2: 1 1 1 | 0 0 0 0
        b0..b3: 1 1 1 | 1 1 1 1
    """
    return causal_mask(q, k) | (q >= block_start)


def training_mask(L, k_block, phases, device=None, noisy_start=0):
    """Dense (B, T, T) training masks, one per row's block size and phase (k_block: an int or (B,), phases:
    (B,) long); T = 2L - noisy_start."""
    T = 2 * L - noisy_start
    q = torch.arange(T, device=device)[:, None]  # (T, 1)
    k = torch.arange(T, device=device)[None, :]  # (1, T)
    k_block = torch.as_tensor(k_block, device=device).expand(len(phases))  # (B,)
    return sbd_training_mask(q[None], k[None], L, k_block[:, None, None], phases[:, None, None],
                             noisy_start)  # (B, T, T)


def training_block_mask(L, k_block, phases, noisy_start=0):
    """training_mask as a flex_attention BlockMask: the same pure function, evaluated tile by tile (GPU, long L).

    k_block goes in as a tensor: compiled flex_attention specialises on Python ints in the mask function and
    would recompile for every block size drawn, while a tensor's value is free to change.
    """
    k_block, T = torch.as_tensor(k_block, device=phases.device).expand(len(phases)), 2 * L - noisy_start  # (B,)
    return block_mask(lambda b, q, k: sbd_training_mask(q, k, L, k_block[b], phases[b], noisy_start), len(phases),
                      T, T, phases.device)


# -----------------------------------------------------------------------------
# training: noising, labels, loss (Eq. 14)


def add_noise(x, mask_id, maskable=None, generator=None):
    """x̂: each token of x (B, L) replaced by mask_id with probability η, η ~ U(0,1) drawn once per sequence.

    maskable (B, L) bool restricts the noise to some tokens (e.g. the answer); others stay clean.
    Returns (x̂, is_masked).
    """
    B, L = x.shape
    device = generator.device if generator is not None else x.device  # train.py's CPU generator, a GPU batch
    eta = torch.rand(B, 1, generator=generator, device=device).to(x.device)  # (B, 1): one masking rate per row
    is_masked = torch.rand(B, L, generator=generator, device=device).to(x.device) < eta  # (B, L)
    if maskable is not None:
        is_masked &= maskable
    return torch.where(is_masked, torch.full_like(x, mask_id), x), is_masked


def first_noisy_position(maskable, k_block, phases):
    """Where the noisy half may start: the start of the block that holds the first position any row may mask
    (k_block: an int, or (B,) for a block size per row).

    Noisy copies before it are never masked and no masked token's block reaches back to them, so no label and
    no attention reads them: leaving them out changes no logit that is read, only the cost (the demo's 13
    prompt tokens are 9% of its 146-token SBD forward).
    """
    if maskable is None:
        return 0
    first = maskable.int().argmax(dim=1)  # (B,) each row's first maskable position (0 for a row with none)
    block_starts = first - (first - phases) % k_block  # (B,)
    return max(int(block_starts.min()), 0)


def sbd_inputs(x, y, mask_id, k_block, phases, maskable=None, generator=None, flex=False, noisy_start=None):
    """The SBD training forward's tokens, positions, mask and labels for clean x (B, L) with NTP targets y.

    The forward is [clean x_0..x_{L-1} ; noisy x̂_s..x̂_{L-1}] with s = noisy_start (default:
    first_noisy_position, 0 without maskable: the paper's 2L). k_block: one block size, or (B,) one per row.
    Labels: clean position i -> y[i] (= x[i+1], next token); noisy position i -> x[i] if masked, else ignored.
    Returns idx (B, T), pos (T,), mask (B, T, T) (a BlockMask of it if flex), labels (B, T); T = 2L - s.
    """
    B, L = x.shape
    noisy, is_masked = add_noise(x, mask_id, maskable, generator)
    s = first_noisy_position(maskable, k_block, phases) if noisy_start is None else noisy_start
    idx = torch.cat([x, noisy[:, s:]], dim=1)  # (B, T)
    pos = torch.cat([torch.arange(L), torch.arange(s, L)]).to(x.device)  # (T,): the noisy copy reuses positions
    noisy_labels = torch.where(is_masked, x, torch.full_like(x, IGNORE_INDEX))  # (B, L)
    labels = torch.cat([y, noisy_labels[:, s:]], dim=1)  # (B, T)
    mask = training_block_mask(L, k_block, phases, s) if flex else training_mask(L, k_block, phases, x.device, s)
    return idx, pos, mask, labels


def sbd_loss(logits, labels, L, ntp_weight=1.0):
    """Eq. 14: cross-entropy over all labelled positions, NTP (clean half) and masked tokens (noisy half).

    ntp_weight=1 is the paper's single cross-entropy over both halves; ntp_weight=0 drops the NTP term
    (the paper's ablation, which hurts NTP quality). Returns (loss, ntp_loss, mtp_loss) for logging.
    """
    V = logits.size(-1)
    per_token = F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1),
                                ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape)  # (B, T)
    labelled = (labels != IGNORE_INDEX).float()
    weight = torch.cat([labelled[:, :L] * ntp_weight, labelled[:, L:]], dim=1)  # (B, T): clean half, noisy half
    loss = (per_token * weight).sum() / weight.sum().clamp(min=1)
    ntp = (per_token[:, :L] * labelled[:, :L]).sum() / labelled[:, :L].sum().clamp(min=1)
    mtp = (per_token[:, L:] * labelled[:, L:]).sum() / labelled[:, L:].sum().clamp(min=1)
    return loss, ntp.detach(), mtp.detach()


# -----------------------------------------------------------------------------
# decoding (SBD.md "Inference"): reveal rules, token choice, NTP and SBD decoding through one KV cache
#
# Both decoders share one convention, so that their forward counts and timings compare like with like:
# prompt[:-1] is prefilled causally into the KV cache (one forward, counted apart as "prefill"), and the last
# prompt token stays "pending": the first decode forward feeds it, as every later one feeds the newest tokens.


# reveal rules: (B, k, V) probabilities + (B, k) is_masked -> (B, k) reveal, a subset of is_masked with at
# least one position per row that has any mask. Vectorised over the batch: no per-row Python loop, because
# a per-sample loop in the sampler ate the whole speed-up of the prototype (FINDINGS.md).


def entropy(probs):
    """Entropy of each position's distribution, (B, k, V) -> (B, k); 0 * log 0 counts as 0."""
    return torch.special.entr(probs).sum(-1)


def sort_masked(key, is_masked):
    """Sort each row's masked positions by key ascending; ties keep the lower position first (stable sort).

    Returns order (B, k), the block positions in that order with the unmasked ones last, and
    masked_sorted (B, k) bool, True where the sorted slot holds a masked position.
    """
    key = torch.where(is_masked, key, float("inf"))  # unmasked positions sort last
    order = torch.sort(key, dim=1, stable=True).indices  # (B, k)
    return order, is_masked.gather(1, order)


def unsort(accept_sorted, order):
    """Scatter a decision made in sorted order (B, k) back to block positions (B, k)."""
    return torch.zeros_like(accept_sorted).scatter(1, order, accept_sorted)


def entropy_bound(h_sorted, masked_sorted, gamma):
    """Eq. 8 on entropies already in reveal order: accept the s-th iff H_(1) + ... + H_(s-1) <= γ.

    Entropies are >= 0, so the running sum only grows and the accepted slots are a prefix of the order;
    the first masked slot always passes (empty sum 0 <= γ), so every row with a mask reveals at least one.
    """
    h = torch.where(masked_sorted, h_sorted, 0.0)  # (B, k)
    before = F.pad(torch.cumsum(h, dim=1)[:, :-1], (1, 0))  # (B, k): sum of the entropies ahead of each slot
    return masked_sorted & (before <= gamma)


def reveal_entropy(probs, is_masked, gamma):
    """EB-Sampler with the entropy proxy (Ben-Hamu et al. 2025, Eq. 8), the SBD paper's default.

    Rule: sort the masked positions by entropy, lowest first (ties: lower position first). Reveal the s
    lowest, s >= 1 the largest count with H_(1) + ... + H_(s-1) <= γ, i.e. the revealed entropies minus the
    largest of them stay within the budget γ. γ = 0 reveals one token per forward (more only where the model
    is exactly certain, entropy 0); a huge γ reveals every masked position at once.
    """
    h = entropy(probs)  # (B, k)
    order, masked_sorted = sort_masked(h, is_masked)
    return unsort(entropy_bound(h.gather(1, order), masked_sorted, gamma), order)


def reveal_confidence(probs, is_masked, gamma):
    """EB-Sampler with the confidence proxy (Ben-Hamu et al. 2025, Eq. 18).

    Rule: sort the masked positions by confidence c = max_v p(v), highest first (ties: lower position first),
    then apply the same entropy bound to the entropies in that order: reveal the first s, s >= 1 the largest
    count with H_(1) + ... + H_(s-1) <= γ.
    """
    order, masked_sorted = sort_masked(-probs.amax(-1), is_masked)
    return unsort(entropy_bound(entropy(probs).gather(1, order), masked_sorted, gamma), order)


def reveal_factor(probs, is_masked, f):
    """Fast-dLLM's factor rule (Wu et al. 2025, arXiv:2505.22618; SBD paper appendix B.1).

    Rule: sort the masked positions by confidence c = max_v p(v), highest first (ties: lower position first);
    reveal the first n, n the largest count with (n + 1) * (1 - c_(n)) < f, and at least one. This is the
    rule as the Fast-dLLM paper writes it; its code (get_transfer_index_dynamic) accepts the n-th while
    c_(n) >= 1 - f / (n + 1), i.e. also on equality. SBD.md's "(n+1)·c_(n) < f" drops the "1 -": with it a
    confident position would be the one held back. c_(n) falls and n + 1 grows along the order, so the
    accepted positions are a prefix of it.
    """
    conf = probs.amax(-1)  # (B, k)
    order, masked_sorted = sort_masked(-conf, is_masked)
    n = torch.arange(1, conf.size(1) + 1, device=conf.device)  # (k,): 1-based rank in the order
    passes = ((n + 1) * (1 - conf.gather(1, order)) < f) | (n == 1)  # (B, k)
    return unsort(masked_sorted & passes, order)


REVEAL_RULES = {"entropy": reveal_entropy, "confidence": reveal_confidence, "factor": reveal_factor}

# -----------------------------------------------------------------------------
# token choice


def suppress_mask(logits, mask_id):
    """The mask token is an input, never an output: its logit becomes -inf before anything else."""
    if mask_id is None:
        return logits
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    return logits


def pick_tokens(logits, temperature=0.0, top_k=None, generator=None):
    """(..., V) logits -> (...) token ids.

    Temperature 0 is argmax (greedy, the paper's setting). Otherwise sample from softmax(logits / temperature),
    restricted to the top_k most likely tokens when top_k is set.
    """
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1).reshape(-1, logits.size(-1))  # (N, V)
    return torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1])


@dataclass
class BlockSampler:
    """Turns one forward's block logits into revealed tokens: the sampling settings of sbd_generate."""
    mask_id: int
    rule: str = "entropy"  # a key of REVEAL_RULES
    gamma: float = 0.1  # γ of the EB-Sampler rules, or f of the factor rule
    temperature: float = 0.0
    top_k: int | None = None
    generator: torch.Generator | None = None

    def step(self, logits, block, is_masked):
        """logits (B, k, V), block (B, k) ids, is_masked (B, k) -> (new block, revealed (B, k) bool).

        Tokens are chosen from the logits with the mask token removed; which of them to reveal is decided on
        the temperature-1 model distribution (also without the mask token), whatever the sampling temperature.
        """
        logits = suppress_mask(logits, self.mask_id)
        tokens = pick_tokens(logits, self.temperature, self.top_k, self.generator)  # (B, k)
        probs = F.softmax(logits.float(), dim=-1)  # (B, k, V)
        revealed = REVEAL_RULES[self.rule](probs, is_masked, self.gamma)  # (B, k)
        return torch.where(revealed, tokens, block), revealed

    def next_token(self, causal_logits):
        """(B, V) next-token logits -> (B,) the token NTP decoding would emit there (argmax, or a sample)."""
        return pick_tokens(suppress_mask(causal_logits, self.mask_id), self.temperature, self.top_k, self.generator)


# -----------------------------------------------------------------------------
# what a decode returns besides the tokens


@dataclass
class Step:
    """One SBD forward, kept when record_steps=True: the block after the forward and what it revealed."""
    block_start: int  # index of the block's first token among the generated tokens
    tokens: torch.Tensor  # (B, kb) the block after this forward, mask_id where still masked
    revealed: torch.Tensor  # (B, kb) bool, the positions this forward revealed
    check: "Check | None" = None  # verify=True: what this forward's causal logits said of the previous block


@dataclass
class Check:
    """verify=True: the verdict of one forward's causal logits on the drafts it committed (batch 1)."""
    start: int  # index of the first checked draft among the generated tokens
    kept: list  # the drafts that matched greedy NTP
    rejected: list  # the drafts thrown away: the first wrong one and every one after it
    correction: int | None  # NTP's token in place of the first wrong draft (None: all drafts were right)


@dataclass
class DecodeStats:
    """What one decode cost, per batch row. Counts include the stop token: it had to be generated too."""
    nfe: list  # decode forwards per row: forwards in which the row still had tokens to produce
    tokens: list  # tokens generated per row, up to and including the first stop token
    prefill_forwards: int  # causal forwards over prompt[:-1] before decoding (0 for a 1-token prompt)
    prefill_time: float  # seconds of the prefill
    wall_time: float  # seconds of the whole decode, prefill included
    steps: list = None  # record_steps: one Step per decode forward
    # verify=True only (batch 1): drafted tokens that NTP confirmed, that it rejected, forwards whose every
    # reveal was rejected, and forwards that only checked the last block (no new block to start)
    accepted: list = None
    rejected: list = None
    wasted_forwards: list = None
    final_checks: list = None

    @property
    def tokens_per_forward(self):
        """Per row: tokens / decode forwards (1.0 for NTP; the NFE speed-up for SBD)."""
        return [t / max(n, 1) for t, n in zip(self.tokens, self.nfe)]


# -----------------------------------------------------------------------------
# shared steps of both decoders: checks, prefill, cutting at the stop token


def check_prompt(model, prompt, n_slots):
    """-> prompt as a (B, T0) long tensor on the model's device; n_slots = positions decoding needs past it."""
    if not torch.is_tensor(prompt):
        lengths = sorted({len(row) for row in prompt})
        if len(lengths) > 1:
            raise ValueError(f"prompts of unequal lengths {lengths}: a batch must share one length "
                             "(decode them separately)")
        prompt = torch.tensor(list(prompt), dtype=torch.long)
    if prompt.dim() == 1:
        prompt = prompt[None]  # one prompt -> a batch of one
    if prompt.numel() == 0:
        raise ValueError("empty prompt: decoding needs at least one token to start from (e.g. a newline)")
    if n_slots < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {n_slots}")
    if prompt.size(1) + n_slots > model.max_seq_len:
        raise ValueError(f"prompt of {prompt.size(1)} tokens + {n_slots} more positions is past the model's "
                         f"context of {model.max_seq_len} tokens: shorten the prompt or max_new_tokens")
    return prompt.to(next(model.parameters()).device)


def prefill(model, prompt, max_len):
    """Write prompt[:-1] into a fresh KV cache with one causal forward.

    Returns (cache, pending (B, 1) = the last prompt token, dict(prefill_forwards=..., prefill_time=...)).
    """
    t0 = time.perf_counter()
    B, T0 = prompt.shape
    cache = model.new_cache(B, max_len, prompt.device, dtype=next(model.parameters()).dtype)
    if T0 > 1:
        model(prompt[:, :-1], cache=cache)
    synchronize(prompt.device)
    return cache, prompt[:, -1:], dict(prefill_forwards=int(T0 > 1), prefill_time=time.perf_counter() - t0)


def synchronize(device):
    """Wait for the accelerator, so that a wall-clock reading includes the work queued on it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def finish(out, stop, nfe, prefill_stats, t0, steps=None):
    """Cut each row of out (B, N) after its first stop token -> (list of token lists, DecodeStats)."""
    is_stop = torch.isin(out, stop)  # (B, N)
    first_stop = is_stop.int().argmax(dim=1)  # (B,): index of the first stop token (0 if none)
    lengths = torch.where(is_stop.any(dim=1), first_stop + 1, out.size(1)).tolist()  # .tolist() waits
    tokens = [row[:n] for row, n in zip(out.tolist(), lengths)]
    stats = DecodeStats(nfe=nfe.tolist(), tokens=lengths, wall_time=time.perf_counter() - t0, steps=steps,
                        **prefill_stats)
    return tokens, stats


# -----------------------------------------------------------------------------
# next-token decoding: the baseline


@torch.inference_mode()
def ntp_generate(model, prompt, max_new_tokens, stop_ids=(), temperature=0.0, top_k=None, generator=None,
                 mask_id=None):
    """Plain next-token decoding through the KV cache: one forward per generated token.

    prompt (B, T0), rows of equal length. After the prefill, each forward feeds the pending tokens (B, 1) and
    yields the next ones, so NFE = tokens generated. A row is done at its first stop token; the batch stops
    when every row is done or after max_new_tokens. mask_id (optional) is never emitted.
    Returns (tokens, stats): tokens[b] = row b's new ids up to and including its first stop token.
    """
    prompt = check_prompt(model, prompt, max_new_tokens)
    t0 = time.perf_counter()
    B, T0 = prompt.shape
    cache, pending, prefill_stats = prefill(model, prompt, T0 + max_new_tokens)
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=prompt.device)
    out, done, nfe = [], torch.zeros(B, dtype=torch.bool, device=prompt.device), torch.zeros_like(prompt[:, 0])
    while len(out) < max_new_tokens and not done.all():
        logits, _ = model(pending, cache=cache)  # (B, 1, V)
        nfe += ~done  # a row's count stops at its stop token
        pending = pick_tokens(suppress_mask(logits, mask_id), temperature, top_k, generator)  # (B, 1)
        out.append(pending)
        done |= torch.isin(pending[:, 0], stop)
    return finish(torch.cat(out, dim=1) if out else prompt[:, :0], stop, nfe, prefill_stats, t0)


# -----------------------------------------------------------------------------
# set block decoding (Algorithms 2 and 3)


def block_forward(model, cache, prev, block):
    """One SBD forward -> (causal logits of prev (B, n_prev, V), block logits (B, kb, V)).

    Feeds [prev ; block]. prev (B, n_prev) is the pending prompt token or the previous, finished block: it is
    processed causally and committed to the cache (n_commit = n_prev), so its logits are next-token logits,
    the very ones NTP decoding computes at those positions. The block slots attend to the whole prefix and to
    each other (hybrid_mask) and are never committed. Position ids are the slot indices, forward's default:
    block slot i stands for the token at position cache.length + n_prev + i and predicts the token AT it.
    """
    L, n_prev = cache.length, prev.size(1)
    idx = torch.cat([prev, block], dim=1) if n_prev else block  # (B, T), T = n_prev + kb
    T = idx.size(1)
    mask = dense_mask(lambda q, k: hybrid_mask(q, k, L + n_prev), T, L + T, query_offset=L,
                      device=idx.device)  # (T, L + T)
    logits, _ = model(idx, mask=mask, cache=cache, n_commit=n_prev)  # (B, T, V)
    return logits[:, :n_prev], logits[:, n_prev:]


def stop_reached(block, is_masked, stop):
    """(B,) bool: rows whose block holds a stop token with every position up to it revealed.

    Such a row is finished: what follows its stop token is cut anyway, so waiting for those positions would
    only waste forwards (FINDINGS.md pitfall 3: the stop token is often revealed first).
    """
    prefix_revealed = is_masked.cumsum(dim=1) == 0  # (B, kb): no mask at or before the slot
    return (torch.isin(block, stop) & prefix_revealed).any(dim=1)


def reveal_first(block, is_masked, causal, sampler):
    """Slot 0 of a new block gets the token NTP decoding would emit there: the committed prefix's last causal
    logit predicts exactly that position, and the first forward of a block computes it anyway.
    It is revealed without spending the reveal rule's budget. -> (block, is_masked, revealed (B, kb))."""
    revealed = torch.zeros_like(is_masked)
    revealed[:, 0] = is_masked[:, 0]
    block[:, 0] = torch.where(revealed[:, 0], sampler.next_token(causal[:, -1]), block[:, 0])
    return block, is_masked & ~revealed, revealed


def decode_block(model, cache, prev, kb, active, sampler, stop, causal_logits=None, logits=None,
                 first_from_ntp=True):
    """Algorithm 3: fill a block of kb masks for every active row; the first forward also commits prev.

    Slot 0 comes from the first forward's causal logits (reveal_first; first_from_ntp=False: the paper's way,
    slot 0 is a mask like the others); the reveal rule picks among the other masked slots in that forward and
    in every later one (which feed the block alone). The batch runs forwards until every active row's block
    is full; a row that reaches its stop token leaves at once.
    causal_logits, logits: the first forward, when the caller already ran it (exact mode).
    Returns block (B, kb), finished (B,) bool, nfe (B,) = forwards in which each row still had masks, and
    steps = [(block, revealed)] per forward.
    """
    B = prev.size(0)
    block = prev.new_full((B, kb), sampler.mask_id)  # (B, kb)
    is_masked = active[:, None].expand(B, kb).clone()  # rows already done take no part
    finished, nfe, steps = torch.zeros_like(active), torch.zeros_like(prev[:, 0]), []
    while is_masked.any():
        if logits is None:
            causal_logits, logits = block_forward(model, cache, prev, block)  # (B, n_prev, V), (B, kb, V)
        nfe += is_masked.any(dim=1)
        revealed = torch.zeros_like(is_masked)
        if prev.size(1):  # the first forward of the block: its causal logits give slot 0 exactly
            if first_from_ntp:
                block, is_masked, revealed = reveal_first(block, is_masked, causal_logits, sampler)
            prev = prev[:, :0]  # committed now: later forwards of this block feed the block alone
        block, by_rule = sampler.step(logits, block, is_masked)
        revealed |= by_rule
        is_masked &= ~by_rule
        finished |= stop_reached(block, is_masked, stop)
        is_masked &= ~finished[:, None]
        steps.append((block, revealed))
        logits = None
    return block, finished, nfe, steps


@torch.inference_mode()
def sbd_generate(model, prompt, k, gamma, rule="entropy", mask_id=None, max_new_tokens=256, stop_ids=(),
                 temperature=0.0, top_k=None, generator=None, record_steps=False, verify=False, first_from_ntp=None):
    """Set Block Decoding through the KV cache (Algorithms 2 and 3 of the paper).

    prompt (B, T0), rows of equal length. Blocks of k tokens (the last one shorter if max_new_tokens says so)
    start as k mask tokens (mask_id); each forward predicts every masked position and `rule` (a key of
    REVEAL_RULES, threshold gamma: γ of the EB-Sampler, f of the factor rule) reveals some of them.
    The first forward of a block feeds [previous block ; block] and commits the previous block causally,
    later ones feed the block alone; nothing of a block's bidirectional forwards is ever cached. The first
    forward's causal logits also give the block's first token exactly as NTP would (reveal_first), unless
    first_from_ntp is False (None: model.ntp_head, False for a model SBD-tuned without the NTP term, whose
    next-token logits were never trained; then slot 0 is revealed by the rule, as in the paper).
    Rows reveal independently: a row's greedy result is the same as decoding it alone (sampling draws from
    one random stream for the whole batch, so sampled rows are not). A row is done as soon
    as it has revealed a stop token and everything before it; it is cut after that stop token.
    verify=True: exact mode (verified_generate): greedy, batch 1, output == ntp_generate's token for token
    (first_from_ntp does not apply: the exact mode's output is NTP decoding's by definition).
    Returns (tokens, stats): tokens[b] = row b's new ids up to and including its first stop token;
    stats.nfe[b] counts the decode forwards in which row b still had masks (record_steps: stats.steps).
    """
    check_sbd_args(model, k, gamma, rule, mask_id, stop_ids, temperature, verify)
    first_from_ntp = getattr(model, "ntp_head", True) if first_from_ntp is None else first_from_ntp
    prompt = check_prompt(model, prompt, max_new_tokens)  # the last block is cut to fit: no slack of k needed
    t0 = time.perf_counter()
    B, T0 = prompt.shape
    cache, prev, prefill_stats = prefill(model, prompt, T0 + max_new_tokens)
    sampler = BlockSampler(mask_id, rule, gamma, temperature, top_k, generator)
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=prompt.device)
    if verify:
        if B != 1:
            raise ValueError(f"verify=True decodes one prompt at a time (got a batch of {B}): rows reject drafts "
                             "at different places, so their KV caches would need different lengths")
        return verified_generate(model, cache, prev, k, max_new_tokens, sampler, stop, prefill_stats, t0,
                                 record_steps)
    blocks, done, nfe = [], torch.zeros(B, dtype=torch.bool, device=prompt.device), torch.zeros_like(prompt[:, 0])
    steps, n_out = [] if record_steps else None, 0
    while n_out < max_new_tokens and not done.all():
        kb = min(k, max_new_tokens - n_out)
        block, finished, block_nfe, block_steps = decode_block(model, cache, prev, kb, ~done, sampler, stop,
                                                               first_from_ntp=first_from_ntp)
        if record_steps:
            steps += [Step(n_out, tokens.cpu(), revealed.cpu()) for tokens, revealed in block_steps]
        blocks.append(block)
        prev, done, nfe, n_out = block, done | finished, nfe + block_nfe, n_out + kb
    out = torch.cat(blocks, dim=1) if blocks else prompt[:, :0]
    return finish(out, stop, nfe, prefill_stats, t0, steps)


# -----------------------------------------------------------------------------
# exact SBD: every drafted token is checked by the causal logits of the forward that commits it


def verified_generate(model, cache, prev, k, max_new_tokens, sampler, stop, prefill_stats, t0, record_steps):
    """Exact SBD decoding of one row (sbd_generate(verify=True)): the output is greedy NTP's, token for token.

    The forward that commits a block (the first forward of the next block) computes, for every token of it,
    the causal logits of the position before: exactly what greedy NTP decoding computes there. So it checks
    the block for free, like speculative decoding with the model's own masked-token head as the draft model:
      - each draft must equal the argmax of the causal logits before it (the block's first token needs no
        check: it came from such an argmax already, reveal_first);
      - at the first wrong draft j: keep the drafts before j, emit NTP's token instead of draft j, forget the
        cache entries from j on, throw away the new block (its drafts were conditioned on the wrong token) and
        start the next block after the corrected token;
      - the block that ends the row (stop token, or max_new_tokens) gets one more forward that only checks.
    So γ only trades forwards spent on rejected drafts against tokens per forward; it never changes the output.
    Batch 1 only: rows reject at different places, so their caches would need different lengths.
    """
    stop_ids = set(stop.tolist())
    out, steps = [], [] if record_steps else None  # out: verified tokens; prev[0, 0] is verified, the rest drafts
    nfe = accepted = rejected = wasted = final_checks = 0
    last = False  # prev is the row's last block (it holds the stop token or reaches max_new_tokens)
    prev_steps = []  # decode_block's steps of the block in prev: which forward revealed which draft (read on a reject)
    active = torch.ones(1, dtype=torch.bool, device=prev.device)
    while True:
        n_drafts = prev.size(1) - 1
        kb = 0 if last else min(k, max_new_tokens - len(out) - n_drafts)  # 0: a forward that only checks
        causal, logits = block_forward(model, cache, prev, prev.new_full((1, kb), sampler.mask_id))
        nfe, final_checks = nfe + 1, final_checks + last
        # the check is on at most k ints: two copies to the host per forward, then plain Python
        ntp = suppress_mask(causal[0], sampler.mask_id).argmax(-1).tolist()  # greedy NTP's token after each slot
        drafts = prev[0, 1:].tolist()
        n_ok = next((i for i, (d, t) in enumerate(zip(drafts, ntp)) if d != t), n_drafts)  # right ones from the left
        check = Check(len(out), drafts[:n_ok], drafts[n_ok:], None)
        out += drafts[:n_ok]
        accepted += n_ok
        if n_ok < n_drafts:  # draft n_ok + 1 of the block is wrong: NTP's token replaces it
            cache.truncate(cache.length - (n_drafts - n_ok))  # keep the block up to the last right draft
            rejected += n_drafts - n_ok
            wasted += sum(min(slots) > n_ok for slots in slots_per_forward(first_reveals(prev_steps)))
            out.append(ntp[n_ok])
            check.correction = out[-1]
            if record_steps:  # the new block is thrown away unseen
                steps.append(Step(len(out), prev[:, :0].cpu(), prev[:, :0].bool().cpu(), check))
            if out[-1] in stop_ids or len(out) == max_new_tokens:
                break
            prev, last, prev_steps = prev.new_tensor([[out[-1]]]), False, []  # verified; the next forward commits it
            continue
        if kb == 0:  # the last block checked out: done
            if record_steps:
                steps.append(Step(len(out), prev[:, :0].cpu(), prev[:, :0].bool().cpu(), check))
            break
        block, _, block_nfe, block_steps = decode_block(model, cache, prev, kb, active, sampler, stop, causal, logits)
        nfe += int(block_nfe) - 1  # its first forward is the one counted above
        if record_steps:
            steps += [Step(len(out), tokens.cpu(), revealed.cpu(), check if i == 0 else None)
                      for i, (tokens, revealed) in enumerate(block_steps)]
        row = block[0].tolist()
        out.append(row[0])  # reveal_first's token is NTP's: verified already
        if out[-1] in stop_ids or len(out) == max_new_tokens:
            break
        n_keep = first_stop(row, stop_ids) + 1  # the row's last block ends at its stop token
        prev, prev_steps = block[:, :n_keep], block_steps
        last = row[n_keep - 1] in stop_ids or len(out) + n_keep - 1 == max_new_tokens
    return verified_finish(out, nfe, accepted, rejected, wasted, final_checks, prefill_stats, t0, steps)


def first_reveals(block_steps):
    """For each slot of a finished block (B=1): the index of the forward that revealed it ([] for no steps)."""
    if not block_steps:
        return []
    revealed_by = [None] * block_steps[0][1].size(1)
    for i, (_, revealed) in enumerate(block_steps):
        for slot in torch.nonzero(revealed[0]).flatten().tolist():
            revealed_by[slot] = i
    return revealed_by


def slots_per_forward(revealed_by):
    """[slots revealed by forward 0, by forward 1, ...] from first_reveals' list (slots never revealed skipped)."""
    forwards = {}
    for slot, i in enumerate(revealed_by):
        if i is not None:
            forwards.setdefault(i, []).append(slot)
    return [forwards[i] for i in sorted(forwards)]


def first_stop(row, stop_ids):
    """Index of the first stop token in a block's ids (a list), or the last index if there is none (keep it all)."""
    return next((i for i, t in enumerate(row) if t in stop_ids), len(row) - 1)


def verified_finish(out, nfe, accepted, rejected, wasted, final_checks, prefill_stats, t0, steps):
    stats = DecodeStats(nfe=[nfe], tokens=[len(out)], wall_time=time.perf_counter() - t0, steps=steps,
                        accepted=[accepted], rejected=[rejected], wasted_forwards=[wasted],
                        final_checks=[final_checks], **prefill_stats)
    return [out], stats


def check_sbd_args(model, k, gamma, rule, mask_id, stop_ids, temperature=0.0, verify=False):
    """Clear errors for settings sbd_generate cannot run with."""
    if k < 1:
        raise ValueError(f"block size k must be at least 1, got {k}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0 (0 reveals one token per forward), got {gamma}")
    if rule not in REVEAL_RULES:
        raise ValueError(f"unknown reveal rule {rule!r}; choose one of {sorted(REVEAL_RULES)}")
    vocab_size = model.config.vocab_size
    if mask_id is None or not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask id {mask_id} is outside the model's vocabulary of {vocab_size} tokens")
    if mask_id in stop_ids:
        raise ValueError(f"mask id {mask_id} cannot also be a stop token")
    if verify and temperature != 0:
        raise ValueError("verify=True checks drafts against greedy NTP decoding: it needs temperature=0 "
                         "(sampling would need speculative decoding's acceptance rule)")


def format_steps(steps, decode, mask_id, prompt=None, row=0):
    """The paper's Figure 2b in a terminal: one row's block after each of its forwards, as text.

    Tokens revealed by that forward are shown [x], still-masked positions _, earlier reveals plainly.
    verify=True adds what each committing forward's check found: drafts it rejected are shown ~struck~ and
    NTP's token that replaced the first of them {in braces}.
    steps: stats.steps of sbd_generate(record_steps=True); decode: ids -> text (e.g. tokenizer.decode).
    """
    lines = [f"prompt {prompt!r}"] if prompt is not None else []
    taken = [s for s in steps if s.revealed[row].any() or s.check is not None]  # the forwards this row took part in
    for i, step in enumerate(taken):
        cells = [format_cell(decode, t, new, mask_id)
                 for t, new in zip(step.tokens[row].tolist(), step.revealed[row].tolist())]
        last = step.block_start + len(cells) - 1
        text = f"tokens {step.block_start:3d}-{last:<3d}  {''.join(cells)}" if cells else ""
        lines.append(f"forward {i + 1:3d}  {text}{format_check(step.check, decode)}".rstrip())
    return "\n".join(lines)


def format_cell(decode, token, newly_revealed, mask_id):
    """One block position: '_' masked, '[x]' revealed by this forward, 'x' revealed before."""
    if token == mask_id:  # revealed tokens are never the mask token (suppress_mask)
        return "_"
    text = printable(decode([token]))
    return f"[{text}]" if newly_revealed else text


def format_check(check, decode):
    """verify=True: what a forward's causal logits said of the drafts it committed ('' for none)."""
    if check is None or not (check.kept or check.rejected):
        return ""
    end = check.start + len(check.kept) + len(check.rejected) - 1
    where = f"checks tokens {check.start}-{end}: "
    if check.correction is None:
        return f"   {where}all {len(check.kept)} drafts right"
    kept, rejected = printable(decode(check.kept)), printable(decode(check.rejected))
    return f"   {where}{kept}{{{printable(decode([check.correction]))}}}~{rejected}~"


def printable(text):
    return text.replace("\n", "\\n")  # keep one line per forward
