"""
Assignment 13 (design: token shift), checked by behaviour only, whatever alignment you chose:

- no labelled slot can see its own target through the training mask (its own input, a slot of its
  block holding the target unmasked, or the clean copy of the target): every token is distinct
  here, so a label names the position it came from;
- a short run from an NTP-trained model: the masked-token loss falls below a bound that the
  paper's unshifted rule cannot meet after the same steps, with labels on most masked positions.
The grader's hidden tests add decoding: a model whose block slots predict what its causal slots
predict decodes to NTP's tokens with every draft right, decoding reads where training taught, and
cached decoding equals uncached.
"""

import pytest
import torch
from test_experiments import experiments

import sbd
from model import IGNORE_INDEX


def seen_by(mask, pos, idx, slot, target, mask_id, L):
    """Where slot may see the token of position target unmasked, in words ('' if nowhere)."""
    sees = mask[slot] & (pos == target) & (idx != mask_id)  # (T,)
    if not sees.any():
        return ""
    key = int(sees.nonzero()[0])
    if key == slot:
        return "it is the slot's own input"
    if key < L:
        return f"it is the clean copy of position {target} (slot {key})"
    return f"it is the unmasked input of slot {key}, in the slot's own block"


def test_labels_never_show_a_slot_its_target():
    g = torch.Generator().manual_seed(0)
    B, L, mask_id = 6, 24, 99
    x = torch.arange(L).repeat(B, 1)  # every position its own token: a label names its position
    for k, noisy_start, complementary in ((4, 0, False), (5, 0, True), (8, 6, False)):
        phases = torch.randint(0, k, (B,), generator=g)
        maskable = (torch.arange(L) >= noisy_start).expand(B, L)
        idx, pos, mask, labels = sbd.sbd_inputs(x, x, mask_id, k, phases, maskable, g,
                                                noisy_start=noisy_start, token_shift=True,
                                                complementary=complementary)
        assert (labels[:, L:] != IGNORE_INDEX).any(), "token_shift labels no noisy slot at all"
        for b, t in (labels[:, L:] != IGNORE_INDEX).nonzero().tolist():
            slot, target = L + t, int(labels[b, L + t])
            where = seen_by(mask[b], pos, idx[b], slot, target, mask_id, L)
            assert not where, (
                f"k={k}, block phase {int(phases[b])}: noisy slot {slot} (position "
                f"{int(pos[slot])}) is labelled with the token of position {target}, and the "
                f"training mask lets it see that token: {where}. A slot that sees its target "
                "learns to copy it, the loss falls for nothing, and at decoding time there is "
                "nothing to copy: label a slot only with a token that is masked wherever the slot "
                "can look")


@pytest.mark.slow
def test_a_short_run_from_an_ntp_model_learns_fast(tmp_path):
    """SHORT SBD steps with token_shift from the NTP-trained start of the graded experiments
    (assignments/experiments.py): the masked-token loss on val, as train.py estimates it, must
    fall below BOUND. Measured on the reference (one thread, a 2-core Xeon, seeds 1337, 2 and 3 of
    the SBD steps): 0.28-0.30 for token shift, 1.28-1.59 for the paper's rule at the same steps
    (7.9 at step 0)."""
    course = experiments()
    x, _, answer = course_task_rows()
    g = torch.Generator().manual_seed(1)
    phases = sbd.block_phases(answer, 8, "answer")
    idx, pos, mask, labels = sbd.sbd_inputs(x, x, 0, 8, phases, answer, g, token_shift=True)
    masked = int((idx[:, x.size(1):] == 0).sum())
    labelled = int((labels[:, x.size(1):] != IGNORE_INDEX).sum())
    assert labelled >= 0.6 * masked, (
        f"token_shift labels {labelled} noisy slots for {masked} masked positions: most masked "
        "positions must be some slot's target, or the masked-token head has little to learn")
    folder = tmp_path / "shift"
    folder.mkdir()
    (folder / "ckpt_resume.pt").write_bytes(open(course.START, "rb").read())
    course.train(str(folder), ["--init_from=resume", f"--sbd_iters={SHORT}",
                               f"--eval_interval={SHORT}", "--token_shift=True"])
    val = course.estimates(str(folder))[-1]["val"][1]
    assert val < BOUND, (
        f"after {SHORT} SBD steps from an NTP-trained model the masked-token val loss under "
        f"token_shift is {val:.2f}; the bound is {BOUND}. The paper's rule is at 1.3-1.6 there "
        "and an alignment that reuses the pretrained model's at about 0.3. Yours makes the "
        "masked-token head learn something the pretrained slots do not already predict: which "
        "token does a slot of the pretrained model predict, and which slot should then predict a "
        "block position?")


SHORT, BOUND = 30, 0.8


def course_task_rows(n=64):
    """The first n val rows of data/addition: x (n, L), y, answer (n, L) bool."""
    from tasks import CharTask

    x, y, answer = CharTask("addition").training_tensors("val", True)
    return x[:n], y[:n], answer[:n]
