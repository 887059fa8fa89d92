"""
SBD's training mask through flex_attention, for long sequences on a GPU (train.py's
attention='flex'). A dense (B, T, T) mask keeps SDPA off its flash kernel (it is materialised,
often as a float bias); flex_attention evaluates the same pure function, sbd.sbd_training_mask,
tile by tile and skips the fully masked tiles (about half). The result goes where model.attention
takes a mask: an attention function with the mask built in.

    idx, pos, mask, labels = sbd.sbd_inputs(x, y, mask_id, k, phases, make_mask=flex_training_mask)
"""

import functools

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from sbd import sbd_training_mask, sequence_positions


@functools.cache
def compiled_flex_attention():
    """flex_attention runs eagerly on a CPU (forward only, slowly: tests); a GPU needs it compiled.
    Made on first use, because merely wrapping it in torch.compile costs seconds at import."""
    return torch.compile(flex_attention, dynamic=False)


class FlexAttention:
    """Attention of q (B, n_head, T, hd) over k, v (B, n_kv_head, T, hd) under a BlockMask."""

    def __init__(self, block_mask):
        self.block_mask = block_mask

    def __call__(self, q, k, v):
        flex = compiled_flex_attention() if q.is_cuda else flex_attention
        return flex(q, k, v, block_mask=self.block_mask, enable_gqa=k.size(1) != q.size(1))


def block_mask(mask_fn, batch_size, n_queries, n_keys, device=None):
    """A mask function of (batch row b, query slot q, key slot k) as a flex_attention BlockMask:
    the row may choose the mask (e.g. a per-row block phase)."""
    return create_block_mask(lambda b, h, q, k: mask_fn(b, q, k), B=batch_size, H=None,
                             Q_LEN=n_queries, KV_LEN=n_keys, device=device)


def flex_training_mask(L, k, phases, device=None, noisy_start=0, copies=1):
    """sbd.training_mask's masks, one per row's phase (phases (B,)), as a FlexAttention; the same
    arguments, so sbd.sbd_layout takes either as make_mask.

    k goes in as a tensor: compiled flex_attention specialises on Python ints in the mask function
    and would recompile for every block size drawn, while a tensor's value is free to change."""
    T = sequence_positions(L, noisy_start, copies).numel()  # the layout's one rule
    phases = phases.to(device)
    k = torch.tensor(k, device=phases.device)

    def mask_fn(b, q, kv):
        return sbd_training_mask(q, kv, L, k, phases[b], noisy_start)

    return FlexAttention(block_mask(mask_fn, len(phases), T, T, phases.device))
