"""report/screen.py's read-out against decoding's own forward, written out here: for each block of
a row, the gold prefix, then a block of masks, one uncached forward under the hybrid mask; block
position 0 is read from the causal logits before the block, position j >= 1 from the slot the
checkpoint's alignment names (sbd.read_at: the rule itself is tested elsewhere; here, that the
read-out reads where decoding reads)."""

import os

import pytest
import torch

from checkpoint import load_checkpoint
from model import dense_mask
from report import screen
from sbd import hybrid_mask, read_at
from tasks import CharTask

CKPT = os.path.join(os.path.dirname(__file__), "data", "old_sbd.pt")


@torch.no_grad()
def decoded_flags(model, x, answer, k, mask_id, token_shift):
    """(L,) bool per answer position: its block's first forward after a gold prefix gets it;
    and (L,) the negative log-likelihood of the answer token there."""
    L, start = x.size(0), int(answer.int().argmax())
    flags, nll = torch.zeros(L, dtype=torch.bool), torch.zeros(L)
    for b in range(start, L, k):
        kb = min(k, L - b)
        idx = torch.cat([x[:b], torch.full((kb,), mask_id)])[None]  # (1, b + kb)
        mask = dense_mask(lambda q, kv: hybrid_mask(q, kv, b), b + kb, b + kb)
        logits, _ = model(idx, pos=torch.arange(b + kb), mask=mask)
        logits[..., mask_id] = float("-inf")
        for j in range(kb):
            slot = b - 1 if j == 0 else b + int(read_at(j, token_shift))
            flags[b + j] = int(logits[0, slot].argmax()) == int(x[b + j])
            nll[b + j] = -torch.log_softmax(logits[0, slot], -1)[x[b + j]]
    return flags & answer, nll


@pytest.mark.parametrize("token_shift", [False, True])
def test_read_out_is_the_first_forward_of_each_block(token_shift):
    model, checkpoint = load_checkpoint(CKPT)
    checkpoint["config"] = dict(checkpoint["config"], token_shift=token_shift)
    x, _, answer = CharTask(checkpoint["dataset"]).training_tensors("val", True)
    x, answer, k = x[:6], answer[:6], 8
    r = screen.read_out(model, checkpoint, x, answer, k, torch.autocast("cpu", enabled=False), 4)
    for row in range(len(x)):
        expected, nll = decoded_flags(model, x[row], answer[row], k, checkpoint["mask_id"],
                                      token_shift)
        read = r["is_read"][row]
        assert torch.equal(r["correct"][row][read], expected[read]), row
        assert torch.allclose(r["nll"][row][read], nll[read], atol=1e-4), row
        drafts = read & ((torch.arange(x.size(1)) - r["phases"][row]) % k > 0)
        assert torch.equal(r["is_draft"][row], drafts), row
    runs, by_position = screen.block_stats(r, k)
    assert len(runs) == 6 * 8 and 0 < sum(runs) < 6 * 8 * (k - 1)  # 60-token traces: 8 blocks
    flags = r["correct"][0][r["is_read"][0]].tolist()[1:8]  # row 0's first block's drafts
    assert runs[0] == next((n for n, ok in enumerate(flags) if not ok), 7)


def test_paired_difference_by_hand():
    d = screen.paired([1, 2, 3, 0], [2, 2, 5, 0])
    assert d["diff"] == 0.75 and d["better"] == 2 and d["worse"] == 0
    assert abs(d["se"] - (((0.25 ** 2 + 0.75 ** 2 + 1.25 ** 2 + 0.75 ** 2) / 3) / 4) ** 0.5) < 1e-12
