"""
decode.py, the reference decoders for one prompt, against the serving decoders (serving/batched.py,
serving/exact.py) at batch 1: the same tokens, the same forwards (count and width of each) and, for
exact SBD, the same drafts kept and rejected; sampled decodes with the same generator seed make the
same draws. Models are in float32, tiny random ones and tests/data/old_sbd.pt (a tiny trained
model): both sides compute the same numbers, so they agree to the bit. And against an independent
definition: exact SBD's tokens are NTP decoding's (float64 random models, as tests/test_exact.py,
so that no argmax flips on rounding between a 1-token and a block forward), also with a block
adapter attached, whose NTP decoding is the base model's.
"""

import copy
import os

import pytest
import torch
from test_exact import ScriptedDrafts

import decode
import sampling
import tiny_models
from checkpoint import load_checkpoint, settings_for
from model import attach_adapter
from sbd import is_adapter
from serving import batched, exact
from serving.settings import serving_settings

FAMILIES = ["gpt-tiny", "llama-tiny"]
GAMMA = {"gpt-tiny": 1.5, "llama-tiny": 2.0}  # 1-4 reveals per forward (tests/test_decoding.py)
HERE = os.path.join(os.path.dirname(__file__), "data")


def random_model(family, seed=0, dtype=torch.float32):
    return tiny_models.random_model(family, seed, std=0.5, dtype=dtype)


def mask_id_of(m):
    return m.config.vocab_size - 1


def prompt_and_stop(m, seed, T0=5):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, m.config.vocab_size - 1, (1, T0), generator=g)
    return prompt, int(torch.randint(0, m.config.vocab_size - 1, (1,), generator=g))


def both(reference, serving, m, prompt, settings, n, seed=None):
    """(reference's (tokens, stats), serving's), each with its own generator of the same seed."""
    generators = [None if seed is None else torch.Generator().manual_seed(seed) for _ in "ab"]
    return (reference(m, prompt, settings, n, generators[0]),
            serving(m, prompt, settings, n, generators[1]))


def assert_same(ours, theirs, checks=False):
    (tokens, stats), (serving_tokens, serving_stats) = ours, theirs
    assert tokens == serving_tokens
    assert stats.tokens == serving_stats.tokens and stats.nfe == serving_stats.nfe
    assert stats.widths == serving_stats.widths, "the same forwards, each as wide"
    assert stats.prefill_forwards == serving_stats.prefill_forwards
    if checks:
        assert (stats.accepted, stats.rejected) == (serving_stats.accepted, serving_stats.rejected)

def greedy_cases(m, grid, **fields):
    """(prompt, settings) for two prompts x each (k, gamma, rule) of grid x without and with a stop
    token; fields: the other settings."""
    for p in range(2):
        prompt, stop = prompt_and_stop(m, p)
        for k, gamma, rule in grid:
            for stop_ids in ([], [stop]):
                yield prompt, sampling.DecodeSettings(mask_id=mask_id_of(m), k=k, gamma=gamma,
                                                      rule=rule, stop_ids=stop_ids, **fields)


# -----------------------------------------------------------------------------
# the reference against serving, token for token and forward for forward


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ntp_is_servings(family, temperature):
    m = random_model(family)
    for p in range(3):
        prompt, stop = prompt_and_stop(m, p, T0=1 + 2 * p)  # a 1-token prompt: no prefill
        for stop_ids in ([], [stop]):
            settings = sampling.DecodeSettings(mask_id=mask_id_of(m), stop_ids=stop_ids,
                                               temperature=temperature, top_k=20)
            assert_same(*both(decode.ntp, batched.ntp_generate, m, prompt, settings, 24, seed=p))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("token_shift", [False, True])
def test_plain_sbd_is_servings(family, token_shift):
    m = random_model(family)
    grid = ((1, 0.0, "entropy"), (4, GAMMA[family], "entropy"), (8, GAMMA[family], "confidence"),
            (8, 0.5, "factor"), (16, 0.0, "left"), (16, 1e9, "entropy"))
    for prompt, settings in greedy_cases(m, grid, token_shift=token_shift):
        assert_same(*both(decode.sbd, batched.sbd_generate, m, prompt, settings, 21))


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_sbd_sampled_and_without_the_ntp_term_is_servings(family):
    m = random_model(family)
    prompt, stop = prompt_and_stop(m, 3)
    for fields in (dict(temperature=1.0), dict(temperature=0.7, top_k=10, top_p=0.9),
                   dict(first_from_ntp=False), dict(first_from_ntp=False, temperature=1.0)):
        settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=GAMMA[family],
                                           stop_ids=[stop], **fields)
        for seed in range(3):
            assert_same(*both(decode.sbd, batched.sbd_generate, m, prompt, settings, 20, seed))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("token_shift", [False, True])
def test_exact_greedy_is_servings(family, token_shift):
    m = random_model(family)
    grid = ((1, 0.0, "entropy"), (4, 0.0, "entropy"), (8, GAMMA[family], "entropy"),
            (16, 1e9, "entropy"))
    for prompt, settings in greedy_cases(m, grid, exact=True, token_shift=token_shift):
        assert_same(*both(decode.exact, exact.exact_generate, m, prompt, settings, 23),
                    checks=True)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("token_shift", [False, True])
def test_exact_sampled_is_servings(family, token_shift):
    """The same seed, the same draws in the same order: the check's (a uniform per draft, then one
    token per position), then the drafts'."""
    m = random_model(family)
    prompt, stop = prompt_and_stop(m, 4)
    for k, gamma, top_k in ((2, 1e9, None), (4, 0.5, None), (8, 1e9, 10), (16, 0.0, None)):
        settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=k, gamma=gamma, rule="left",
                                           stop_ids=[stop], exact=True, temperature=1.0,
                                           top_k=top_k, token_shift=token_shift)
        for seed in range(3):
            ours, theirs = both(decode.exact, exact.exact_generate, m, prompt, settings, 23, seed)
            assert_same(ours, theirs, checks=True)


def test_a_wrong_draft_is_caught_where_it_is():
    """A model whose drafts are NTP's tokens but at one position (tests/test_exact.py): the
    reference rejects exactly that draft, and NTP's token takes its place."""
    m = random_model("gpt-tiny", dtype=torch.float64)
    prompt, _ = prompt_and_stop(m, 0)
    ntp, _ = decode.ntp(m, prompt, sampling.DecodeSettings(mask_id=mask_id_of(m)), 30)
    scripted = ScriptedDrafts(m, prompt[0].tolist() + ntp[0] + [0] * 8, prompt.size(1) + 11)
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9, exact=True)
    out, stats = decode.exact(scripted, prompt, settings, 30)
    assert out == ntp and stats.rejected == [5]  # draft 11 and the 4 after it in its block
    assert_same((out, stats), exact.exact_generate(scripted, prompt, settings, 30), checks=True)


def test_serving_fields_take_serving_decoders():
    """The reference's record has no serving field; sample.py's decoders are decode.py's unless a
    serving field is set (or a weight layout, or the step view)."""
    m = random_model("gpt-tiny")
    prompt, _ = prompt_and_stop(m, 0)
    with pytest.raises(TypeError, match="adaptive"):
        sampling.DecodeSettings(mask_id=mask_id_of(m), exact=True, adaptive=True)
    reference = sampling.DecodeSettings(mask_id=mask_id_of(m), exact=True)
    for fields, serves in ((dict(), False), (dict(adaptive=True), True),
                           (dict(min_draft_prob=0.5), True)):
        settings = serving_settings(reference, **fields)
        _, settings, sbd, ntp = exact.decoders(m, settings, prompt, 8, False, "trained", 1, None,
                                               as_loaded=False)
        if serves:
            assert sbd.func is exact.decode and ntp.func is exact.decode
        else:
            assert (sbd, ntp) == (decode.exact, decode.ntp)


# -----------------------------------------------------------------------------
# a tiny trained model: drafts that are mostly right


def trained():
    """tests/data/old_sbd.pt and six test prompts of its task (tests/data/record_checkpoint_...)."""
    m, checkpoint = load_checkpoint(os.path.join(HERE, "old_sbd.pt"))
    chars = checkpoint["tokenizer"]["chars"]
    prompts = ["Q:52+228=?A:", "Q:999+1=?A:", "Q:7+86=?A:", "Q:140+305=?A:", "Q:61+759=?A:",
               "Q:33+4=?A:"]
    return m, checkpoint, [torch.tensor([[chars.index(c) for c in p.rjust(13)]]) for p in prompts]


def test_a_trained_model_decodes_as_serving_does():
    m, checkpoint, prompts = trained()
    runs = [(decode.ntp, batched.ntp_generate, dict(gamma=0.0)),
            (decode.sbd, batched.sbd_generate, dict(k=8, gamma=0.1)),
            (decode.sbd, batched.sbd_generate, dict(k=16, gamma=1e9)),
            (decode.sbd, batched.sbd_generate, dict(k=8, gamma=0.1, temperature=1.0)),
            (decode.exact, exact.exact_generate, dict(k=8, gamma=1e9, exact=True)),
            (decode.exact, exact.exact_generate, dict(k=16, gamma=0.1, exact=True)),
            (decode.exact, exact.exact_generate, dict(k=8, gamma=0.1, exact=True,
                                                      temperature=1.0))]
    accepted = 0
    for reference, serving, args in runs:
        settings = settings_for(checkpoint, **args)
        for seed, prompt in enumerate(prompts):
            ours, theirs = both(reference, serving, m, prompt, settings, 59, seed)
            assert_same(ours, theirs, checks=settings.exact)
            accepted += sum(ours[1].accepted or [0])
            if settings.exact and settings.temperature == 0:
                assert ours[0] == decode.ntp(m, prompt, settings, 59)[0]
    assert accepted > 500, "a trained model's drafts are mostly kept: the check is exercised"

# -----------------------------------------------------------------------------
# exact SBD against NTP, an independent definition


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("token_shift", [False, True])
def test_exact_is_ntp(family, token_shift):
    m = random_model(family, dtype=torch.float64)
    rejected = 0
    for p in range(3):
        prompt, stop = prompt_and_stop(m, p)
        for stop_ids in ([], [stop]):
            ntp, _ = decode.ntp(m, prompt, sampling.DecodeSettings(mask_id=mask_id_of(m),
                                                                   stop_ids=stop_ids), 24)
            for k, gamma in ((1, 0.0), (4, 0.1), (16, 1e9)):
                settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=k, gamma=gamma,
                                                   stop_ids=stop_ids, exact=True,
                                                   token_shift=token_shift)
                out, stats = decode.exact(m, prompt, settings, 24)
                assert out == ntp, (p, stop_ids, k, gamma)
                assert stats.tokens == [len(ntp[0])] and stats.nfe == [len(stats.widths)]
                rejected += stats.rejected[0]
    assert rejected > 50, "random drafts must really be rejected, or this test checks nothing"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("token_shift", [False, True])
def test_exact_with_a_block_adapter_is_the_bases_ntp(family, token_shift):
    """An adapter with random weights (not the zero-delta start) drafts other tokens than the base
    model, but the next-token path is the base's: exact SBD must decode the base's NTP tokens."""
    base = random_model(family, dtype=torch.float64)
    m = attach_adapter(copy.deepcopy(base), 4, "all", mask_id_of(base)).double().eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if is_adapter(name):
                p.normal_(0.0, 0.5)
    rejected = 0
    for p in range(3):
        prompt, _ = prompt_and_stop(m, 10 + p)
        ntp, _ = decode.ntp(base, prompt, sampling.DecodeSettings(mask_id=mask_id_of(m)), 30)
        settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9, exact=True,
                                           token_shift=token_shift)
        out, stats = decode.exact(m, prompt, settings, 30)
        assert out == ntp
        assert_same((out, stats), exact.exact_generate(m, prompt, settings, 30), checks=True)
        rejected += stats.rejected[0]
    assert rejected > 0, "the adapter's drafts differ from the base's: some are rejected"
    plain = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9)
    assert decode.sbd(m, prompt, plain, 16)[0] != decode.sbd(base, prompt, plain, 16)[0], (
        "plain SBD reads the adapter: the reference passes the block to the model")

# -----------------------------------------------------------------------------
# sample.py: decode.py's decoders by default, serving's for the step view; the same lines


@pytest.mark.slow
def test_sample_prints_the_same_with_either_path(tmp_path):
    from test_decoding import CALIBRATED, run_sample, write_checkpoint

    write_checkpoint(tmp_path / "ckpt_sbd.pt", "sbd", CALIBRATED)
    for extra in ([], ["--exact=True"], ["--exact=True", "--temperature=0.8"]):
        printed = []
        for steps in ("False", "True"):  # the step view takes serving's path
            done = run_sample(tmp_path, "--start=ab", "--raw=True", "--max_new_tokens=20",
                              f"--show_steps={steps}", *extra)
            assert done.returncode == 0, done.stderr
            lines = [line.split("; wall")[0] for line in done.stdout.splitlines()
                     if not line.startswith(("config:", "forward", "prompt '"))]
            printed.append(lines)
        assert printed[0] == printed[1] and any("forwards" in line for line in printed[0])
