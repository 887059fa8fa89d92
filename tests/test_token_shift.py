"""Token shift and complementary masks (docs/method.md, Token shift): the masks of two noisy copies
by hand, the complement drawn over the answer, exact SBD under token shift against NTP (greedy per
row, sampled in distribution), and a checkpoint written before the setting existed, decoded as it
was then. Token shift's labels and reads written out are assignment 13's solution: they are hidden
tests (tests/hidden/test_hidden_token_shift.py)."""

import importlib.util
import json
import os

import pytest
import torch
from test_exact_serving import (
    chi_square_bound,
    enumerate_ntp,
    sampled_histogram,
    statistic,
    tiny_sampling_model,
)

import sampling
import sbd
import tiny_models
from checkpoint import load_checkpoint, settings_for
from configurator import ConfigError
from model import dense_mask
from serving import exact
from test_decoding import FAMILIES, GAMMA, mask_id_of, random_model, random_prompts

X = torch.arange(10, 18)[None]  # (1, 8): x_0..x_7 = 10..17

# -----------------------------------------------------------------------------
# masks by hand


def test_sbd_inputs_draws_the_complement_over_the_maskable_tokens():
    g = torch.Generator().manual_seed(3)
    maskable = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    idx, pos, _, labels = sbd.sbd_inputs(X, X + 100, 99, 4, torch.tensor([0]), maskable, g,
                                         complementary=True)
    first, second = idx[0, 8:12], idx[0, 12:16]  # noisy_start 4: two copies of positions 4..7
    assert pos.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7]
    assert ((first == 99) ^ (second == 99)).all(), "each answer token is masked in one copy"
    assert (torch.where(first == 99, second, first) == X[0, 4:]).all()


def test_two_copy_mask_by_hand():
    """L = 4, k = 2, phase 0: [c0..c3 ; copy 1 of positions 0..3 ; copy 2]. A copy attends to its
    own block and the clean prefix before it, never to the other copy."""
    rows = dense_mask(lambda q, kv: sbd.sbd_training_mask(q, kv, 4, 2), 12, 12).int().tolist()
    assert rows == [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
    ]


def test_two_copy_mask_from_a_noisy_start_by_hand():
    """noisy_start 2: each copy holds positions 2..3 only (slots 4-5 and 6-7)."""
    rows = dense_mask(lambda q, kv: sbd.sbd_training_mask(q, kv, 4, 2, 0, 2), 8, 8).int().tolist()
    assert rows[4:] == [
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1],
        [1, 1, 0, 0, 0, 0, 1, 1],
    ]
    assert sbd.sequence_positions(4, 2, copies=2).tolist() == [0, 1, 2, 3, 2, 3, 2, 3]


# -----------------------------------------------------------------------------
# decoding under shift


def shifted_checkpoint(m):
    config = dict(token_shift=True, ntp_weight=1.0)
    return dict(mask_id=mask_id_of(m), stop_ids=[], stage="sbd", config=config)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("adaptive", [False, True])
def test_shifted_exact_equals_ntp_per_row(family, adaptive):
    m = random_model(family)
    prompts = random_prompts(m, 4, 5, seed=11)
    ntp, _ = tiny_models.ntp(m, prompts, 30, mask_id=mask_id_of(m))
    for k, gamma in ((4, GAMMA[family]), (16, sampling.ONE_FORWARD)):
        settings = settings_for(shifted_checkpoint(m), k=k, gamma=gamma, exact=True,
                                         adaptive=adaptive)
        assert settings.token_shift
        tokens, stats = exact.exact_generate(m, prompts, settings, 30)
        for b in range(4):
            alone, _ = exact.exact_generate(m, prompts[b:b + 1], settings, 30)
            assert tokens[b] == ntp[b] == alone[0], (k, gamma, b)
        assert sum(stats.accepted) + sum(stats.rejected) > 0  # drafts were checked


def test_shifted_exact_sampling_is_distributed_as_ntp_sampling():
    m = tiny_sampling_model()
    prompt, n = [1, 2, 3], 3
    settings = sampling.DecodeSettings(mask_id=5, k=3, gamma=1e9, rule="left", exact=True,
                                       temperature=1.0, token_shift=True)
    probs = enumerate_ntp(m, prompt, n, 5)
    value, dof = statistic(sampled_histogram(m, prompt, n, settings), probs)
    assert dof >= 10 and value < chi_square_bound(dof)


def test_shift_without_the_causal_first_token_is_refused():
    with pytest.raises(ConfigError, match="first_from_ntp"):
        sampling.DecodeSettings(mask_id=3, token_shift=True, first_from_ntp=False)


# -----------------------------------------------------------------------------
# a checkpoint from before the setting


HERE = os.path.join(os.path.dirname(__file__), "data")


def test_a_checkpoint_without_the_field_decodes_as_it_did():
    """tests/data/old_sbd.pt and its outputs were written before token_shift existed
    (tests/data/record_checkpoint_outputs.py): no field means the paper's rule."""
    spec = importlib.util.spec_from_file_location(
        "record", os.path.join(HERE, "record_checkpoint_outputs.py"))
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    model, checkpoint = load_checkpoint(os.path.join(HERE, "old_sbd.pt"))
    assert "token_shift" not in checkpoint["config"]
    assert not settings_for(checkpoint, gamma=0.1).token_shift
    with open(os.path.join(HERE, "old_sbd_outputs.json")) as f:
        expected = json.load(f)
    assert record.decode_all(model, checkpoint) == expected
