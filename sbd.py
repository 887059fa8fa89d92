"""
Set Block Decoding (Gat et al., arXiv:2509.04185): what the method adds to a transformer for
training.

One forward over [clean x_0..x_{L-1} ; noisy x̂_s..x̂_{L-1}], position ids reused for the noisy copy
(two noisy copies with complementary masks: [clean ; noisy m ; noisy not-m]; slot_layout). The
clean half is ordinary next-token prediction (NTP); the noisy half learns to fill the masked tokens
of a block of k from the clean tokens before the block and the block's unmasked tokens. One
cross-entropy over both halves is the loss (the paper's Eq. 14; docs/method.md, Training).
The paper's training comes first: the layout, the masks, noise, labels and Eq. 14. Two variants
follow. Which block slot predicts which block position is one rule, read_at, that training labels
and every decoder share: the paper's (a slot predicts its own token) or token shift's, which keeps
the pretrained model's next-token alignment (docs/method.md, Token shift). The block adapter trains
a delta that only the block's slots see, the base frozen (docs/method.md, Block adapter).
Decoding with the trained model lives in decode.py (one prompt: NTP, SBD and exact SBD) and, for
serving, in serving/batched.py (batches of NTP and SBD) and serving/exact.py (exact SBD for
batches).

Index convention: 0-based throughout; the paper's x_1..x_L is x[0]..x[L-1] here.
Mask functions take (q, kv): the query slot and the key slot, broadcast over index tensors.
"""

import torch
from torch.nn import functional as F

from model import IGNORE_INDEX, causal_mask, cross_entropy, in_block

# -----------------------------------------------------------------------------
# the training sequence: [clean 0..L-1 ; noisy copy 1 of s..L-1 ; noisy copy 2 ...]


def slot_layout(slot, L, noisy_start=0):
    """(copy, position) of a slot of the training sequence: copy 0 is the clean half (slots
    0..L-1, positions 0..L-1), copy c >= 1 the c-th noisy copy of positions s..L-1 (s =
    noisy_start), slots L + (c-1)(L-s) onwards. Every noisy copy reuses the positions it stands
    for. The one definition of the layout: the mask, positions and labels all go through it."""
    n = max(L - noisy_start, 1)  # slots per noisy copy
    noisy = in_block(slot, L)  # the noisy copies are the training forward's block slots
    copy = torch.where(noisy, 1 + torch.div(slot - L, n, rounding_mode="floor"), 0)
    position = torch.where(noisy, noisy_start + (slot - L) % n, slot)
    return copy, position


def sequence_positions(L, noisy_start=0, copies=1, device=None):
    """(T,) position ids of the training sequence, T = L + copies (L - noisy_start)."""
    T = L + copies * (L - noisy_start)
    return slot_layout(torch.arange(T, device=device), L, noisy_start)[1]


# -----------------------------------------------------------------------------
# attention masks: pure functions of (query slot, key slot)


def block_id(i, k, phase):
    """Block of noisy position i when blocks of k start at positions phase, phase ± k, ...: phase
    lets blocks start where decoding blocks start (the first answer token) instead of at 0."""
    return torch.div(i - phase, k, rounding_mode="floor")


def sbd_training_mask(q, kv, L, k, phase=0, noisy_start=0):
    """Attention mask of the training sequence [clean 0..L-1 ; noisy L..] (True = may attend).
    Slots as slot_layout lays them out; with b(i) the block of noisy position i and start(i) its
    first position:
      clean query i -> clean key j   iff j <= i                       (causal, plain NTP)
      noisy query i -> clean key j   iff j < start(i)                 (the prefix before its block)
      noisy query i -> noisy key j   iff same copy and b(j) == b(i)   (bidirectional in its block)
      clean query   -> noisy key     never                            (NTP must not see noise)
    No noisy copy sees another. k=4, L=8, phase 0 (c = clean, n = noisy, 1 = may attend):
                 c0 c1 c2 c3 c4 c5 c6 c7 | n0 n1 n2 n3 n4 n5 n6 n7
        c0..c7   lower triangle          | 0
        n0..n3   0  0  0  0  0  0  0  0  | 1  1  1  1  0  0  0  0
        n4..n7   1  1  1  1  0  0  0  0  | 0  0  0  0  1  1  1  1
    """
    q_copy, qi = slot_layout(q, L, noisy_start)  # which copy, which position in the sequence
    kv_copy, ki = slot_layout(kv, L, noisy_start)
    q_noisy, kv_noisy = q_copy > 0, kv_copy > 0
    q_block = block_id(qi, k, phase)
    block_start = q_block * k + phase
    clean_clean = ~q_noisy & ~kv_noisy & (ki <= qi)
    noisy_clean = q_noisy & ~kv_noisy & (ki < block_start)
    same_block = (kv_copy == q_copy) & (block_id(ki, k, phase) == q_block)
    return clean_clean | noisy_clean | q_noisy & same_block


def hybrid_mask(q, kv, block_start):
    """Decoding mask over [prefix ; block]: causal up to block_start, then a bidirectional block.
    Slots < block_start (prompt, cache, a block being committed) attend causally; the block's slots
    attend to every prefix slot and to each other. With a KV cache the prefix is [cache ; committed
    previous block]. k=4 block after a 3-token prefix (block_start = 3):
        q0: 1 0 0 | 0 0 0 0
        q1: 1 1 0 | 0 0 0 0
        q2: 1 1 1 | 0 0 0 0
        b0..b3: 1 1 1 | 1 1 1 1
    """
    return causal_mask(q, kv) | in_block(q, block_start)


def training_mask(L, k, phases, device=None, noisy_start=0, copies=1):
    """Dense (B, T, T) training masks, one per row's block phase (phases: (B,) long);
    T = L + copies (L - noisy_start)."""
    T = L + copies * (L - noisy_start)
    q = torch.arange(T, device=device)[:, None]  # (T, 1)
    kv = torch.arange(T, device=device)[None, :]  # (1, T)
    phases = phases.to(device)[:, None, None]  # (B, 1, 1)
    return sbd_training_mask(q[None], kv[None], L, k, phases, noisy_start)  # (B, T, T)


# -----------------------------------------------------------------------------
# noising, labels, loss (Eq. 14)


def add_noise(x, mask_id, maskable=None, generator=None, all_masked_rows=0.0):
    """x (B, L) -> (x̂, is_masked (B, L) bool): a token becomes mask_id with probability min(1, η /
    (1 - all_masked_rows)), η ~ U(0,1) per row (0: the paper's noise; 1: every row masked whole),
    where maskable (B, L) is True, if given. Draws: `generator`'s (a resumed run draws the same)."""
    B, L = x.shape
    device = generator.device if generator is not None else x.device
    eta = torch.rand(B, 1, generator=generator, device=device).to(x.device)  # (B, 1): rate per row
    draws = torch.rand(B, L, generator=generator, device=device).to(x.device)  # (B, L)
    is_masked = draws * (1 - all_masked_rows) < eta  # (B, L)
    if maskable is not None:
        is_masked &= maskable
    return torch.where(is_masked, torch.full_like(x, mask_id), x), is_masked


def block_phases(answer, k, rule, generator=None):
    """(B,) where each row's noisy blocks start, mod k (sbd_training_mask); answer (B, L) bool.
    rule 'answer': at the first answer position (where decoding starts its first block);
    'random': uniform in 0..k-1 per row; 'zero': at position 0 (the paper's fixed grid)."""
    if rule == "answer":
        return answer.int().argmax(dim=1) % k
    if rule == "random":
        return (torch.rand(len(answer), generator=generator).to(answer.device) * k).long()
    return torch.zeros(len(answer), dtype=torch.long, device=answer.device)


def first_noisy_position(maskable, k, phases):
    """Where the noisy half may start: the start of the block that holds the first position any row
    may mask. No label and no attention reads the noisy copies before it (never masked, and no
    masked token's block reaches back to them): leaving them out changes only the cost."""
    if maskable is None:
        return 0
    first = maskable.int().argmax(dim=1)  # (B,) each row's first maskable position (0 if none)
    block_starts = first - (first - phases) % k  # (B,)
    return max(int(block_starts.min()), 0)


def noisy_labels(x, is_masked, k, phases, token_shift=False):
    """(B, L) labels of a noisy copy, by the position each slot stands for. The paper's rule: slot
    i is labelled x[i] if position i is masked, else IGNORE_INDEX (no label); token_shift: the
    labels of token shift's alignment (shift_labels)."""
    if token_shift:
        return shift_labels(x, is_masked, k, phases)
    return torch.where(is_masked, x, IGNORE_INDEX)


def sbd_inputs(x, y, mask_id, k, phases, maskable=None, generator=None, make_mask=None,
               noisy_start=None, token_shift=False, complementary=False, all_masked_rows=0.0):
    """The SBD training forward of clean x (B, L) with NTP targets y (B, L): noise m by add_noise
    on maskable, laid out by sbd_layout -> idx (B, T), pos (T,), mask (B, T, T), labels (B, T).
    noisy_start: s, by default first_noisy_position (0 without maskable: the paper's T = 2L).
    complementary: a second noisy copy, masked by m's complement over the maskable tokens
    (Fast-dLLM v2), so that every maskable token is a masked input once: T = 3L - 2s."""
    _, is_masked = add_noise(x, mask_id, maskable, generator, all_masked_rows)
    masks = [is_masked]
    if complementary:  # the complement: what m kept, masked now; the prompt stays clean in both
        masks.append(~is_masked if maskable is None else maskable & ~is_masked)
    if noisy_start is None:
        noisy_start = first_noisy_position(maskable, k, phases)
    return sbd_layout(x, y, mask_id, masks, k, phases, noisy_start, token_shift, make_mask)


def sbd_layout(x, y, mask_id, masks, k, phases, noisy_start, token_shift=False, make_mask=None):
    """[clean x (B, L) ; a noisy copy of positions s..L-1 (s = noisy_start) per (B, L) bool mask in
    masks, masked tokens replaced by mask_id]: T = L + C (L - s) slots for C copies, laid out by
    slot_layout -> idx (B, T), pos (T,), mask (B, T, T) (training_mask, or make_mask's with its
    arguments: training/flex.py's on a GPU), labels (B, T) (y, the next token, at clean slots;
    noisy_labels at noisy ones)."""
    L, copies = x.size(1), len(masks)
    noisy = [torch.where(masked, mask_id, x)[:, noisy_start:] for masked in masks]
    idx = torch.cat([x, *noisy], dim=1)  # (B, T)
    pos = sequence_positions(L, noisy_start, copies, x.device)  # (T,)
    labels = torch.cat([y] + [noisy_labels(x, masked, k, phases, token_shift)[:, noisy_start:]
                              for masked in masks], dim=1)  # (B, T)
    mask = (make_mask or training_mask)(L, k, phases, x.device, noisy_start, copies)
    return idx, pos, mask, labels


def sbd_loss(logits, labels, L, ntp_weight=1.0):
    """Eq. 14 as a weighted mean over the labelled slots of -log p(label), weight ntp_weight in the
    clean half (the first L slots) and 1 in the noisy copies: 1 is the paper's one cross-entropy,
    0 its ablation without the NTP term. logits (B, T, V), or (N, V) at the labelled slots only
    (model's at). -> (loss, ntp_loss, masked_loss): the last two unweighted, detached, to log."""
    is_labelled = labels != IGNORE_INDEX  # (B, T)
    at_labels = logits if logits.dim() == 2 else logits[is_labelled]  # (N, V)
    nll = torch.zeros(labels.shape, device=logits.device)  # unlabelled slots: 0, weight 0
    nll[is_labelled] = F.cross_entropy(at_labels.float(), labels[is_labelled], reduction="none")
    labelled = is_labelled.float()  # (B, T)
    weight = torch.cat([labelled[:, :L] * ntp_weight, labelled[:, L:]], dim=1)  # (B, T)
    # a batch without labels gives 0, not 0/0; any positive total weight divides as it is
    loss = (nll * weight).sum() / weight.sum().clamp(min=torch.finfo(torch.float32).tiny)
    ntp = (nll[:, :L] * labelled[:, :L]).sum() / labelled[:, :L].sum().clamp(min=1)
    masked = (nll[:, L:] * labelled[:, L:]).sum() / labelled[:, L:].sum().clamp(min=1)
    return loss, ntp.detach(), masked.detach()


# -----------------------------------------------------------------------------
# the alignment: which block slot predicts which block position, the paper's rule or its variant
# token shift's (decoding reads it, training labels its twin)


def read_at(j, token_shift):
    """Block slot whose logits predict block position j (j = 0..k-1 within the block; an int or a
    long tensor, the result alike): the paper's rule, a slot predicts the token at its own
    position, or token shift's (shift_read_at). A slot outside 0..k-1: no slot of the block
    predicts position j."""
    return shift_read_at(j) if token_shift else j


def shift_read_at(j):
    """read_at under token shift: the masked-token head reuses the alignment every slot of the
    pretrained causal model already has, so fine-tuning starts from what the model knows.
    Decoders read position j at this slot (block_predictions) and shift_labels trains it there. A
    result outside 0..k-1: no slot of the block predicts j; position 0 then comes from the causal
    logits before the block (first_from_ntp, which DecodeSettings requires under token shift)."""
    return j - 1


def block_predictions(block_logits, token_shift):
    """Block slots' logits (B, W, V) -> block positions' logits: position j's row is slot
    read_at(j)'s; one no slot predicts (token shift's 0: reveal_first's) gets the nearest's."""
    if not token_shift:
        return block_logits
    W = block_logits.size(1)
    slots = read_at(torch.arange(W, device=block_logits.device), True)
    return block_logits[:, slots.clamp(0, W - 1)]  # (B, W, V)


def shift_labels(x, is_masked, k, phases):
    """noisy_labels under token shift: x (B, L), is_masked (B, L) bool, blocks of k from phases
    (B,) as in sbd_training_mask -> (B, L) labels of a noisy copy, by the position each slot stands
    for (IGNORE_INDEX: no label).

    Which slot learns which token, and when, follows from the alignment: the slot that decoding
    reads for a block position (shift_read_at) must learn that position's token, and no labelled
    slot may see its own target through the training mask (its own input, the other slots of its
    block, the clean tokens before its block).
    """
    B, L = x.shape
    p = torch.arange(L, device=x.device).expand(B, L)  # (B, L): the position a label is of
    start = block_id(p, k, phases[:, None]) * k + phases[:, None]  # (B, L): its block's start
    slot = start + shift_read_at(p - start)  # (B, L): the slot decoding reads it at
    learnt = is_masked & (slot >= start.clamp(min=0))  # masked, read in its block (and sequence)
    rows = torch.arange(B, device=x.device)[:, None].expand(B, L)  # (B, L)
    labels = torch.full_like(x, IGNORE_INDEX)
    labels[rows[learnt], slot[learnt]] = x[learnt]
    return labels


# -----------------------------------------------------------------------------
# a variant, the block adapter: the base frozen, a delta that only the block's slots see


def adapter_loss(model, cache, idx, pos, mask, labels, L, at=None):
    """The SBD step of a block adapter (train.py's adapter_rank): the masked-token term of Eq. 14,
    as sbd_loss computes it with ntp_weight=0 from one forward, for less work. The clean half
    (slots 0..L-1) goes through the frozen model alone (no slot of it is in the block), so it
    runs once without autograd into cache, an empty KV cache of T slots; the noisy copies' forward
    (slots L on, their rows of the mask) attends to it, and only that forward trains.
    idx, pos, mask (dense), labels of sbd_inputs; at (B, T) the slots whose logits are computed
    (None: all). -> (masked-token loss, NTP loss of the clean half (detached), the same loss
    detached)"""
    at_clean, at_noisy = (None, None) if at is None else (at[:, :L], at[:, L:])
    with torch.no_grad():
        clean, _ = model(idx[:, :L], cache=cache, at=at_clean)  # (B, L, V) or (N, V)
        ntp = labelled_loss(clean, labels[:, :L], at_clean)
    noisy, _ = model(idx[:, L:], pos=pos[L:], mask=mask[:, L:], cache=cache, n_commit=0,
                     at=at_noisy, block_start=L)  # (B, T - L, V) or (N, V)
    loss = labelled_loss(noisy, labels[:, L:], at_noisy)
    return loss, ntp, loss.detach()


def is_adapter(name):
    """Whether a parameter or state dict entry is the block adapter's."""
    return name.startswith("block_adapter.") or ".delta." in name


def freeze_base(model):
    """The block adapter alone trains: every other parameter frozen (no gradient, no AdamW
    state), so the next-token path stays the base model's."""
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))


def split_adapter(state):
    """A state dict -> (the base model's entries, the block adapter's)."""
    return ({k: v for k, v in state.items() if not is_adapter(k)},
            {k: v for k, v in state.items() if is_adapter(k)})


def labelled_loss(logits, labels, at):
    """Mean cross-entropy of logits (B, T, V), or (N, V) at the slots at (B, T) marks."""
    return cross_entropy(logits, labels if at is None else labels[at])
