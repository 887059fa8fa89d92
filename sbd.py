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

import torch
from torch.nn import functional as F

from model import IGNORE_INDEX, causal_mask, dense_mask

# -----------------------------------------------------------------------------
# attention masks: pure functions of (query slot, key slot)


def block_id(i, k_block, phase):
    """Block of noisy position i when blocks of k_block start at positions phase, phase ± k_block, ...

    phase lets blocks start where decoding blocks start (e.g. at the first answer token) instead of at 0.
    """
    return torch.div(i - phase, k_block, rounding_mode="floor")


def sbd_training_mask(q, k, L, k_block, phase=0):
    """Attention mask of the 2L training sequence [clean 0..L-1 ; noisy L..2L-1] (True = may attend).

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
    qi, ki = q - L * q_noisy, k - L * k_noisy  # positions within each half
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


def training_mask(L, k_block, phases, device=None):
    """Dense (B, 2L, 2L) training masks, one per sequence phase (phases: (B,) long)."""
    q = torch.arange(2 * L, device=device)[:, None]  # (2L, 1)
    k = torch.arange(2 * L, device=device)[None, :]  # (1, 2L)
    return sbd_training_mask(q[None], k[None], L, k_block, phases[:, None, None])  # (B, 2L, 2L)


# -----------------------------------------------------------------------------
# training: noising, labels, loss (Eq. 14)


def add_noise(x, mask_id, maskable=None, generator=None):
    """x̂: each token of x (B, L) replaced by mask_id with probability η, η ~ U(0,1) drawn once per sequence.

    maskable (B, L) bool restricts the noise to some tokens (e.g. the answer); others stay clean.
    Returns (x̂, is_masked).
    """
    B, L = x.shape
    eta = torch.rand(B, 1, generator=generator, device=x.device)  # (B, 1): one masking rate per sequence
    is_masked = torch.rand(B, L, generator=generator, device=x.device) < eta  # (B, L)
    if maskable is not None:
        is_masked &= maskable
    return torch.where(is_masked, torch.full_like(x, mask_id), x), is_masked


def sbd_inputs(x, y, mask_id, k_block, phases, maskable=None, generator=None):
    """The 2L training forward's tokens, positions, mask and labels for clean x (B, L) with NTP targets y.

    Labels: clean position i -> y[i] (= x[i+1], next token); noisy position i -> x[i] if masked, else ignored.
    Returns idx (B, 2L), pos (2L,), mask (B, 2L, 2L), labels (B, 2L).
    """
    B, L = x.shape
    noisy, is_masked = add_noise(x, mask_id, maskable, generator)
    idx = torch.cat([x, noisy], dim=1)  # (B, 2L)
    pos = torch.arange(L, device=x.device).repeat(2)  # (2L,): the noisy copy reuses the clean positions
    noisy_labels = torch.where(is_masked, x, torch.full_like(x, IGNORE_INDEX))  # (B, L)
    labels = torch.cat([y, noisy_labels], dim=1)  # (B, 2L)
    return idx, pos, training_mask(L, k_block, phases, x.device), labels


def sbd_loss(logits, labels, L, ntp_weight=1.0):
    """Eq. 14: cross-entropy over all labelled positions, NTP (clean half) and masked tokens (noisy half).

    ntp_weight=1 is the paper's single cross-entropy over both halves; ntp_weight=0 drops the NTP term
    (the paper's ablation, which hurts NTP quality). Returns (loss, ntp_loss, mtp_loss) for logging.
    """
    V = logits.size(-1)
    per_token = F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1),
                                ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape)  # (B, 2L)
    labelled = (labels != IGNORE_INDEX).float()
    weight = torch.cat([labelled[:, :L] * ntp_weight, labelled[:, L:]], dim=1)  # (B, 2L)
    loss = (per_token * weight).sum() / weight.sum().clamp(min=1)
    ntp = (per_token[:, :L] * labelled[:, :L]).sum() / labelled[:, :L].sum().clamp(min=1)
    mtp = (per_token[:, L:] * labelled[:, L:]).sum() / labelled[:, L:].sum().clamp(min=1)
    return loss, ntp.detach(), mtp.detach()
