"""
NTP and SBD decoding through the KV cache: NTP against an uncached reference written out here (NTP
decoding is given, not an assignment), SBD by its properties (a batch row decodes as alone, stop
tokens, the mask token never emitted, short last blocks, the statistics, clear errors). SBD against
an uncached reference of its own is a hidden test (tests/hidden/test_hidden_decoding.py), since
that reference is in substance assignment 5's solution. Models are tiny, random and in float64, so
that cached and uncached logits agree to ~1e-12 and no argmax or entropy comparison can flip on
rounding.
"""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import checkpoint as checkpoint_lib
import decode
import model as model_lib
import sampling
import tiny_models
from model import dense_mask
from pretrained.shapes import build_model
from sbd import hybrid_mask
from serving import batched, exact

FAMILIES = ["gpt-tiny", "llama-tiny"]
# moderate for these random models: 1-4 reveals per forward
GAMMA = {"gpt-tiny": 1.5, "llama-tiny": 2.0}


def random_model(family, seed=0):
    """A tiny random model with weights of std 0.5, whose predictions are peaked enough to vary."""
    return tiny_models.random_model(family, seed, std=0.5, dtype=torch.float64)


def mask_id_of(m):
    return m.config.vocab_size - 1  # the last id plays the mask token


def decode_settings(m, **fields):
    """DecodeSettings with the test model's mask token and the given fields."""
    return sampling.DecodeSettings(mask_id=mask_id_of(m), **fields)


def random_prompts(m, B, T0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, m.config.vocab_size - 1, (B, T0), generator=g)

# -----------------------------------------------------------------------------
# NTP's uncached reference


@torch.no_grad()
def reference_ntp(m, prompt_row, max_new_tokens, stop_ids=()):
    """Greedy NTP recomputing the whole context every step (what nanoGPT's sampler does)."""
    seq, out = list(prompt_row), []
    while len(out) < max_new_tokens:
        logits, _ = m(torch.tensor([seq + out]))
        out.append(int(logits[0, -1].argmax()))
        if out[-1] in stop_ids:
            break
    return out


# -----------------------------------------------------------------------------
# cached == uncached


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("B", [1, 3])
def test_cached_ntp_equals_uncached(family, B):
    m = random_model(family)
    prompts = random_prompts(m, B, 5)
    tokens, stats = tiny_models.ntp(m, prompts, 20)
    for b in range(B):
        assert tokens[b] == reference_ntp(m, prompts[b].tolist(), 20)
    assert stats.nfe == [20] * B and stats.tokens == [20] * B and stats.prefill_forwards == 1


def test_a_model_trained_without_the_ntp_term_decodes_without_its_ntp_head():
    """A checkpoint whose run had ntp_weight=0 gets settings that leave slot 0 to the rule; any
    other checkpoint takes slot 0 from the next-token logits (checkpoint.settings_for)."""
    base = dict(mask_id=3, stop_ids=[0], stage="sbd")

    def first_from_ntp(config):
        return checkpoint_lib.settings_for(dict(base, config=config), gamma=0.1).first_from_ntp

    assert not first_from_ntp(dict(ntp_weight=0.0))
    assert first_from_ntp(dict(ntp_weight=0.5))
    assert first_from_ntp({})


# -----------------------------------------------------------------------------
# batches, stop tokens, the mask token


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_equals_each_row_alone(family):
    m = random_model(family, seed=1)
    prompts = random_prompts(m, 4, 6, seed=1)
    plain, _ = batched.sbd_generate(m, prompts, decode_settings(m, k=8, gamma=GAMMA[family]), 24)
    stop = [plain[1][10]]  # a token row 1 really emits, so at least one row stops early
    settings = decode_settings(m, k=8, gamma=GAMMA[family], stop_ids=stop)
    tokens, stats = batched.sbd_generate(m, prompts, settings, 24)
    for b in range(4):
        alone, alone_stats = batched.sbd_generate(m, prompts[b:b + 1], settings, 24)
        assert tokens[b] == alone[0] and stats.nfe[b] == alone_stats.nfe[0], (
            f"row {b}: in a batch a row gets the tokens and forward count it gets alone")
    ntp_tokens, ntp_stats = tiny_models.ntp(m, prompts, 24, stop_ids=stop)
    for b in range(4):
        alone, alone_stats = tiny_models.ntp(m, prompts[b:b + 1], 24, stop_ids=stop)
        assert ntp_tokens[b] == alone[0] and ntp_stats.nfe[b] == alone_stats.nfe[0]


def test_row_stops_without_waiting_for_the_rest_of_its_block():
    """A stop token revealed with everything before it ends the row, even with masks left after
    it."""
    m = random_model("gpt-tiny", seed=2)
    prompt = random_prompts(m, 1, 5, seed=2)
    plain, _ = batched.sbd_generate(m, prompt, decode_settings(m, k=16, gamma=1.5), 16)
    stop = plain[0][2]
    settings = decode_settings(m, k=16, gamma=1.5, stop_ids=[stop])
    tokens, stats = batched.sbd_generate(m, prompt, settings, 16, record_steps=True)
    assert tokens[0] == plain[0][:plain[0].index(stop) + 1]
    last = stats.steps[-1]
    assert (last.tokens[0] == mask_id_of(m)).any(), "the row went on revealing after its stop token"


def test_ntp_stop_tokens():
    m = random_model("llama-tiny", seed=3)
    prompts = random_prompts(m, 3, 4, seed=3)
    plain, _ = tiny_models.ntp(m, prompts, 25)
    stop = plain[2][7]
    tokens, stats = tiny_models.ntp(m, prompts, 25, stop_ids=[stop])
    for b in range(3):
        expected = plain[b][:plain[b].index(stop) + 1] if stop in plain[b] else plain[b]
        assert tokens[b] == expected == reference_ntp(m, prompts[b].tolist(), 25, [stop])
        assert stats.nfe[b] == stats.tokens[b] == len(expected)


def mask_loving(m):
    """Make the mask token the argmax everywhere by adding 100 to its output logit."""
    head = m.lm_head if hasattr(m, "lm_head") else m.output
    mask_id = mask_id_of(m)

    def boost(module, inputs, logits):
        logits = logits.clone()
        logits[..., mask_id] += 100.0
        return logits

    head.register_forward_hook(boost)
    return m


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mask_token_never_in_output(family, temperature):
    m = mask_loving(random_model(family))
    mask_id = mask_id_of(m)
    prompts = random_prompts(m, 2, 4)
    logits, _ = m(prompts)
    assert (logits.argmax(-1) == mask_id).all(), "the test model must prefer the mask token"
    g = torch.Generator().manual_seed(0)
    settings = decode_settings(m, k=4, gamma=1.0, temperature=temperature, top_k=5)
    tokens, _ = batched.sbd_generate(m, prompts, settings, 12, generator=g)
    ntp_tokens, _ = tiny_models.ntp(m, prompts, 12, temperature=temperature, generator=g,
                                          mask_id=mask_id)
    for row in tokens + ntp_tokens:
        assert mask_id not in row, "the mask token is an input only, never emitted"
        assert len(row) == 12, "no stop token: max_new_tokens tokens"


def test_max_new_tokens_not_a_multiple_of_k():
    m = random_model("gpt-tiny")
    prompts = random_prompts(m, 2, 3)
    tokens, stats = batched.sbd_generate(m, prompts, decode_settings(m, k=16, gamma=1.5), 21,
                                          record_steps=True)
    assert [len(t) for t in tokens] == [21, 21] and stats.tokens == [21, 21], (
        "blocks of k until max_new_tokens, never past it")
    assert {s.block_start[0] for s in stats.steps} == {0, 16}, "Step.block_start: 0, then 16"
    assert stats.steps[-1].tokens.shape == (2, 5), "the last block is cut to 21 - 16 = 5 slots"


def test_stats_add_up():
    m = random_model("gpt-tiny")
    tokens, stats = batched.sbd_generate(m, random_prompts(m, 2, 3),
                                          decode_settings(m, k=8, gamma=1.5), 16, record_steps=True)
    assert len(stats.steps) == max(stats.nfe), "one Step per forward of the batch"
    assert stats.tokens_per_forward == [t / n for t, n in zip(stats.tokens, stats.nfe)]
    assert stats.wall_time > 0, "finish(..., t0, ...) measures from the t0 it is given"
    for b in range(2):
        assert sum(int(s.revealed[b].sum()) for s in stats.steps) == 16, (
            "every position revealed once: Step.revealed holds what that forward revealed, slot 0 "
            "included")

# -----------------------------------------------------------------------------
# clear errors


@pytest.mark.parametrize("kwargs, message", [
    (dict(gamma=-0.1), "gamma"),
    (dict(k=0), "block size"),
    (dict(mask_id=64), "outside"),
    (dict(mask_id=-1), "outside"),
    (dict(mask_id=None), "outside"),
    (dict(max_new_tokens=60), "context"),  # 5 + 60 > block_size 64
    (dict(prompt=torch.zeros(1, 0, dtype=torch.long)), "empty"),
    (dict(prompt=[[1, 2, 3], [1, 2]]), "unequal"),
    (dict(rule="greedy"), "rule"),
    (dict(stop_ids=[63]), "stop"),
    (dict(top_p=1.5), "top_p"),
    (dict(exact=True, temperature=0.5), "left to right"),
])
@pytest.mark.parametrize("decoder", ["plain", "exact"])
def test_sbd_errors(kwargs, message, decoder):
    m = random_model("gpt-tiny")
    args = dict(prompt=random_prompts(m, 1, 5), max_new_tokens=8)
    fields = dict(k=16, gamma=0.5, mask_id=63)
    for name in list(kwargs):
        (args if name in args else fields)[name] = kwargs[name]
    run = exact.exact_generate if decoder == "exact" else batched.sbd_generate
    with pytest.raises(ValueError, match=message):
        run(m, args["prompt"], sampling.DecodeSettings(**fields), args["max_new_tokens"])


def test_ntp_errors():
    m = random_model("gpt-tiny")
    with pytest.raises(ValueError, match="context"):
        tiny_models.ntp(m, random_prompts(m, 1, 5), 60)
    with pytest.raises(ValueError, match="empty"):
        tiny_models.ntp(m, [[]], 4)

# -----------------------------------------------------------------------------
# sample.py on tiny checkpoints in the train.py format


CHARS = "\n_abcdefghijklmnopqrstuvwxyz +=?.,"  # '\n' (id 0) stops, '_' (id 1) is the mask token


def write_checkpoint(path, stage, calibration=None):
    """A tiny checkpoint in train.py's layout, and the calibration.json evaluate.py would write."""
    torch.manual_seed(0)
    m = build_model("gpt-tiny", vocab_size=len(CHARS))
    checkpoint = {"model": m.state_dict(), "model_family": "gpt",
                  "model_args": dataclasses.asdict(m.config),
                  "stage": stage, "config": {}, "tokenizer": {"kind": "char", "chars": CHARS},
                  "dataset": "addition", "mask_id": 1, "stop_ids": [0]}
    torch.save(checkpoint, path)
    if calibration is not None:
        checkpoint_lib.write_calibration(str(path), checkpoint, calibration)


def run_sample(out_dir, *args):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "sample.py", f"--out_dir={out_dir}", "--device=cpu",
                           *args],
                          cwd=root, capture_output=True, text=True, timeout=120)


CALIBRATED = dict(k={"8": dict(gamma_low=0.5, gamma_high=1.5, gamma_exact=1e9)}, operating_k=8,
                  exact_k=8)


@pytest.mark.slow
def test_sample_script(tmp_path):
    write_checkpoint(tmp_path / "ckpt_sbd.pt", "sbd", CALIBRATED)
    write_checkpoint(tmp_path / "ckpt_ntp.pt", "ntp")
    done = run_sample(tmp_path, "--start=ab", "--raw=True", "--mode=both", "--num_samples=2",
                      "--max_new_tokens=20", "--show_steps=True")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("SBD k=8 γ=0.5") == 2
    assert "forwards" in done.stdout and "vs NTP" in done.stdout
    failed = run_sample(tmp_path, "--ckpt=ntp", "--mode=sbd", "--start=ab")
    assert failed.returncode == 2 and "is an NTP model" in failed.stderr
    assert "Traceback" not in failed.stderr  # bad input: one line, no traceback
    by_file = run_sample(tmp_path, f"--ckpt={tmp_path / 'ckpt_ntp.pt'}", "--mode=ntp", "--start=ab",
                         "--raw=True", "--max_new_tokens=5")
    assert by_file.returncode == 0 and "NTP: 5 tokens" in by_file.stdout, by_file.stderr


@pytest.mark.slow
def test_sample_script_exact_mode(tmp_path):
    uncalibrated = dict(k={"8": dict(gamma_low=None, gamma_high=None, gamma_exact=1e9)},
                        operating_k=None, exact_k=8)
    write_checkpoint(tmp_path / "ckpt_sbd.pt", "sbd", uncalibrated)
    exact_run = run_sample(tmp_path, "--start=ab", "--raw=True", "--mode=both",
                           "--max_new_tokens=20", "--exact=True", "--show_steps=True")
    assert exact_run.returncode == 0, exact_run.stderr
    assert "exact SBD k=8 γ=1e+09" in exact_run.stdout and "rejected" in exact_run.stdout
    # the same text, by construction
    assert "NTP decoding of the same prompt gives" not in exact_run.stdout
    no_gamma = run_sample(tmp_path, "--start=ab", "--raw=True", "--mode=sbd", "--k=8",
                          "--max_new_tokens=8")
    # never switches mode by itself
    assert no_gamma.returncode == 2 and "needs a γ" in no_gamma.stderr
    sampled = run_sample(tmp_path, "--start=ab", "--raw=True", "--exact=True", "--temperature=0.8",
                         "--max_new_tokens=8")
    assert sampled.returncode == 0 and "exact SBD" in sampled.stdout, sampled.stderr
    wrong_rule = run_sample(tmp_path, "--start=ab", "--exact=True", "--temperature=0.8",
                            "--rule=entropy")
    assert wrong_rule.returncode == 2 and "left to right" in wrong_rule.stderr


@pytest.mark.slow
def test_bench_script_runs():
    """bench/ is a benchmark, not a test; this only checks that both modes still run (tiny
    settings)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tiny = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=128", "--threads=1"]
    for args in (["--what=kvcache", "--new_tokens=20"],
                 ["--what=sbd", "--out_dir=/nonexistent", "--max_new_tokens=32", "--num_prompts=2",
                  "--timing_repeats=2"]):
        done = subprocess.run([sys.executable, "-m", "bench", *args, *tiny], cwd=root,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "speed-up" in done.stdout or "wall clock vs NTP" in done.stdout

# -----------------------------------------------------------------------------
# the decode forward's fixed costs: cut, with the same numbers


def test_attention_bias_is_what_sdpa_makes_of_the_bool_mask():
    """model.attention_bias converts a bool mask once per forward, as SDPA would in every layer:
    same output to the bit; None and an additive bias pass through."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g) for _ in range(3))
    mask = dense_mask(lambda qi, ki: hybrid_mask(qi, ki, 3), 7, 7)  # (T, S)
    bias = model_lib.attention_bias(mask, q.dtype)
    assert bias.dtype == q.dtype and torch.equal(bias == 0, mask)
    assert torch.equal(bias != 0, bias == float("-inf"))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(q, k, v, attn_mask=mask), sdpa(q, k, v, attn_mask=bias))
    assert model_lib.attention_bias(None, q.dtype) is None
    assert model_lib.attention_bias(bias, q.dtype) is bias


def test_dropout_zero_builds_no_dropout_modules():
    """An nn.Dropout that drops nothing still costs a call (9 per forward of the demo GPT): at
    p = 0 there are none; at p > 0 there are, with the same state dict, the same eval logits, and
    dropout in training."""
    plain = build_model("gpt-tiny").eval()
    dropping = build_model("gpt-tiny", dropout=0.5)
    assert not any(isinstance(mod, torch.nn.Dropout) for mod in plain.modules())
    n_dropout = sum(isinstance(mod, torch.nn.Dropout) for mod in dropping.modules())
    assert n_dropout == 2 * dropping.config.n_layer + 1
    dropping.load_state_dict(plain.state_dict())
    idx = random_prompts(plain, 2, 9)
    with torch.no_grad():
        assert torch.equal(plain(idx)[0], dropping.eval()(idx)[0])
        assert not torch.equal(plain(idx)[0], dropping.train()(idx)[0])


def test_stop_reached_by_hand():
    """A row is finished when its block holds a stop token with no mask at or before it."""
    block = torch.tensor([[5, 0, 7], [5, 0, 7], [0, 9, 9], [5, 6, 7], [5, 6, 0]])
    is_masked = torch.tensor([[False, False, True],  # stop at 1, a mask only after it: finished
                              [True, False, False],  # stop at 1, slot 0 still masked: not yet
                              [False, True, True],  # stop first: finished
                              [False, False, False],  # no stop token
                              [False, True, False]])  # stop at 2 behind a mask
    got = decode.stop_reached(block, is_masked, torch.tensor([0])).tolist()
    assert got == [True, False, True, False, False]
