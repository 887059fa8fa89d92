"""
Hidden (the grader's): experiment 14's change is the leak its write-up describes. The reference
leak is written out here: every pair sbd_training_mask allows, and besides, a noisy query and the
clean keys at the positions of its own block.
"""

import importlib.util
import os

import torch

import sbd
from model import dense_mask

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_leak_is_the_one_described():
    spec = importlib.util.spec_from_file_location(
        "course_experiments", os.path.join(ROOT, "assignments", "experiments.py"))
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    for L, k, phase, noisy_start, copies in ((8, 4, 0, 0, 1), (10, 3, 2, 4, 1), (6, 4, 1, 2, 2)):
        T = L + copies * (L - noisy_start)
        honest = dense_mask(lambda q, kv: sbd.sbd_training_mask(q, kv, L, k, phase, noisy_start),
                            T, T)
        leaky = dense_mask(
            lambda q, kv: course.leaky_training_mask(q, kv, L, k, phase, noisy_start), T, T)
        q_copy, q_pos = sbd.slot_layout(torch.arange(T), L, noisy_start)
        same_block = (sbd.block_id(q_pos, k, phase)[:, None]
                      == sbd.block_id(q_pos, k, phase)[None, :])  # (T, T)
        leak = (q_copy[:, None] > 0) & (q_copy[None, :] == 0) & same_block
        where = f"L={L}, k={k}, phase {phase}, noisy_start {noisy_start}, {copies} noisy copies"
        assert not (honest & ~leaky).any(), (
            f"{where}: the leaky mask forbids pairs the training mask allows; the leak only adds")
        extra = leaky & ~honest
        assert torch.equal(extra, leak & ~honest), (
            f"{where}: the leaky mask adds {int(extra.sum())} pairs, the leak of the write-up "
            f"{int((leak & ~honest).sum())}: every noisy query, of every noisy copy, may also see "
            "the clean keys at the positions of its own block, and nothing else is added")
