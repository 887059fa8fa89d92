"""Hidden (the grader's): token shift's labels written out, which are assignment 13's solution, so
they stay out of a handout (tests/test_token_shift.py keeps the rest): the labels of small cases
by hand under both rules, and a labelled slot never seeing its own target. Decoding under token
shift is checked by tests/hidden/test_hidden_assignment_13.py."""

import torch

import sbd
from model import IGNORE_INDEX as NO

X = torch.arange(10, 18)[None]  # (1, 8): x_0..x_7 = 10..17
WORKED = torch.tensor([[0, 1, 0, 1, 1, 1, 0, 1]], dtype=torch.bool)  # docs' worked example's masks


def labels_of(masks, token_shift, phase=0, k=4, noisy_start=0):
    _, _, _, labels = sbd.sbd_layout(X, X + 100, 99, masks, k, torch.tensor([phase]),
                                     noisy_start, token_shift)
    return labels[0, 8:].tolist()  # the noisy copies' labels


def test_labels_of_the_worked_example_paper_and_shift():
    # the paper: slot i is labelled x_i where masked
    assert labels_of([WORKED], False) == [NO, 11, NO, 13, 14, 15, NO, 17]
    # shift: slot i is labelled x_{i+1} where position i+1 is masked and in i's block; the block
    # starts (positions 0 and 4) are masked inputs without a label, the last slots predict nothing
    assert labels_of([WORKED], True) == [11, NO, 13, NO, 15, NO, 17, NO]


def test_shift_labels_follow_the_block_phase():
    # phase 1: blocks [0], [1..4], [5..7]; slot 0 is alone in its block, slot 4 ends its block
    assert labels_of([WORKED], True, phase=1) == [NO, NO, 13, 14, NO, NO, 17, NO]
    assert labels_of([WORKED], False, phase=1) == [NO, 11, NO, 13, 14, 15, NO, 17]


def test_complementary_copies_are_labelled_by_their_own_masks():
    both = [WORKED, ~WORKED]
    assert labels_of(both, False) == ([NO, 11, NO, 13, 14, 15, NO, 17]
                                      + [10, NO, 12, NO, NO, NO, 16, NO])
    assert labels_of(both, True) == ([11, NO, 13, NO, 15, NO, 17, NO]
                                     + [NO, 12, NO, NO, NO, 16, NO, NO])


def test_no_slot_sees_its_own_target():
    """Under either rule and both copies, a labelled slot attends to no slot holding its target
    token unmasked (the label's position, in its own copy or in the clean half)."""
    g = torch.Generator().manual_seed(0)
    L, k = 24, 5
    x = torch.randint(0, 50, (6, L), generator=g)
    phases = torch.randint(0, k, (6,), generator=g)
    for token_shift in (False, True):
        idx, pos, mask, labels = sbd.sbd_inputs(x, x, 99, k, phases, None, g, noisy_start=0,
                                                token_shift=token_shift, complementary=True)
        for b, t in (labels[:, L:] != NO).nonzero().tolist():
            slot = L + t
            target = int(sbd.slot_layout(torch.tensor(slot), L)[1]) + int(token_shift)
            seen = mask[b, slot] & (pos == target) & (idx[b] != 99)  # (T,)
            assert not seen.any(), (token_shift, b, slot)


