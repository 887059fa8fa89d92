"""
SBD training (sbd.py's top half and train.py), checked against docs/method.md and against the
decoding path: the training mask and labels against the worked example, the noise against
"η ~ U(0,1) once per sequence", the 2L training forward against prefill + block forward through
the KV cache, and train.py end to end (both stages, the report, exact resume, clear errors) in
subprocesses with tiny settings.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import checkpoint as checkpoint_lib
import decode
import sbd
from model import IGNORE_INDEX
from tasks import CharTask
from tiny_models import random_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ["gpt-tiny", "llama-tiny"]

# -----------------------------------------------------------------------------
# 7: mask, labels and noise against docs/method.md


def test_training_mask_is_the_worked_example():
    # docs/method.md, L = 8, k = 4; columns: clean x1..x8 | noisy x̂1..x̂8
    # (here 0-based c0..c7 | n0..n7)
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # clean: causal, never the noisy half
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],  # first noisy block: just its own 4 slots
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],  # second: clean x1..x4 + its own 4 slots
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]]
    masks = sbd.training_mask(8, 4, torch.tensor([0, 0]))  # (B, 2L, 2L), one per row
    assert masks.shape == (2, 16, 16)
    assert masks[0].int().tolist() == expected and masks[1].int().tolist() == expected, (
        "not the matrix of docs/method.md (L = 8, k = 4, phase 0): clean rows causal, a noisy row "
        "sees the clean keys before its block and the noisy keys of its own block")


def test_labels_of_the_worked_example(monkeypatch):
    """noisy half [x1, m, x3, m | m, m, x7, m] -> noisy labels [-, x2, -, x4 | x5, x6, -, x8]."""
    M, _ = 99, IGNORE_INDEX
    x = torch.tensor([[11, 12, 13, 14, 15, 16, 17, 18]])  # x1..x8
    y = torch.tensor([[12, 13, 14, 15, 16, 17, 18, 19]])  # their next tokens x2..x9
    is_masked = torch.tensor([[0, 1, 0, 1, 1, 1, 0, 1]]).bool()
    monkeypatch.setattr(sbd, "add_noise", lambda x, mask_id, maskable=None, generator=None,
                        all_masked_rows=0.0: (torch.where(is_masked, mask_id, x), is_masked))
    idx, pos, mask, labels = sbd.sbd_inputs(x, y, M, 4, torch.tensor([0]))
    # no maskable: the noisy half starts at 0 and the forward is the paper's 2L tokens
    assert idx.tolist() == [[11, 12, 13, 14, 15, 16, 17, 18, 11, M, 13, M, M, M, 17, M]], (
        "idx = [x ; x̂]: the clean row, then its noisy copy from add_noise")
    assert pos.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7], (
        "the noisy copy reuses the positions it stands for")
    assert labels.tolist() == [[12, 13, 14, 15, 16, 17, 18, 19, _, 12, _, 14, 15, 16, _, 18]], (
        "clean slot i -> y[i] (the next token); noisy slot i -> x[i] where masked, else "
        "IGNORE_INDEX")
    assert torch.equal(mask, sbd.training_mask(8, 4, torch.tensor([0]))), (
        "mask = training_mask(L, k, phases, x.device, noisy_start=s), here s = 0")


def test_labels_with_random_noise():
    """Noisy position i is labelled x_i exactly where x̂_i is the mask token; clean labels are y."""
    g = torch.Generator().manual_seed(0)
    B, L, M = 16, 40, 50
    x = torch.randint(0, M, (B, L), generator=g)
    y = torch.randint(0, M, (B, L), generator=g)
    y[:, :5] = IGNORE_INDEX  # e.g. loss_on_answer_only: the clean labels are y whatever they hold
    maskable = torch.arange(L) >= 10  # noise on the answer only
    idx, pos, mask, labels = sbd.sbd_inputs(x, y, M, 4, torch.zeros(B, dtype=torch.long),
                                            maskable.expand(B, L), g)
    clean, noisy = idx[:, :L], idx[:, L:]
    s = 2 * L - idx.size(1)  # where the noisy half starts
    assert s == 8, (
        f"idx has {idx.size(1)} slots, so the noisy half starts at position {s}; expected 8 = "
        "first_noisy_position(maskable, 4, phases): the start of the block (k=4, phase 0) that "
        "holds the first maskable position, 10. Noisy copies before it are never masked and never "
        "read, so sbd_inputs leaves them out: T = 2L - s slots, not 2L")
    assert torch.equal(pos, torch.cat([torch.arange(L), torch.arange(s, L)])), (
        "pos = [0..L-1, s..L-1]: the noisy copy reuses the positions it stands for")
    assert torch.equal(clean, x) and torch.equal(labels[:, :L], y), (
        "the clean half is x as it is, labelled with y (whatever y holds, IGNORE_INDEX included)")
    is_masked = noisy == M
    assert torch.equal(noisy[~is_masked], x[:, s:][~is_masked]), (
        "a noisy slot of position i holds x[i] or the mask token")
    noisy_labels = labels[:, L:]
    assert torch.equal(noisy_labels[is_masked], x[:, s:][is_masked]), (
        "a masked noisy slot of position i is labelled x[i]")
    assert (noisy_labels[~is_masked] == IGNORE_INDEX).all(), "an unmasked noisy slot: no label"
    assert not is_masked[:, :10 - s].any(), "positions outside maskable must never be masked"
    assert 0 < is_masked.float().mean() < 0.9, "about half of the maskable positions masked"


def test_masking_rate_is_drawn_per_sequence():
    """η ~ U(0,1) once per sequence: the rows' mask fractions spread over (0, 1), while inside a row
    both halves are masked at the same rate (that row's η)."""
    B, L = 400, 1000
    x = torch.zeros(B, L, dtype=torch.long)
    _, is_masked = sbd.add_noise(x, 1, generator=torch.Generator().manual_seed(0))
    frac = is_masked.float().mean(dim=1)  # (B,)
    # U(0,1) has std 0.29; a rate per batch gives ~0, a rate per token ~0.016
    assert frac.std() > 0.2, f"rows' mask fractions spread {frac.std():.3f}: draw η once per row"
    assert frac.min() < 0.05 and frac.max() > 0.95, (
        "η ~ U(0, 1): some rows almost clean, some almost all masked")
    first, second = is_masked[:, :L // 2].float().mean(1), is_masked[:, L // 2:].float().mean(1)
    # binomial noise of 500 draws: std of the difference <= 0.032
    assert (first - second).abs().max() < 0.15, "one η per row, used for every token of the row"


def test_all_masked_rows_by_hand():
    """all_masked_rows = f: a token is masked when its draw u ~ U(0,1) satisfies u (1 - f) < η, the
    row's rate, written out here from the same generator's draws. f = 0 is the paper's noise, bit
    for bit; f = 1 masks every maskable token; f = 0.5 masks a row whole with probability f +
    (1 - f) / (L + 1) (η >= 1 - f, or η ~ U(0, 1) below it masking all L tokens)."""
    B, L = 20_000, 8
    x, maskable = torch.zeros(B, L, dtype=torch.long), torch.ones(B, L, dtype=torch.bool)
    maskable[:, 0] = False
    for f in (0.0, 0.5, 1.0):
        generator = torch.Generator().manual_seed(3)
        eta, u = torch.rand(B, 1, generator=generator), torch.rand(B, L, generator=generator)
        expected = (u * (1 - f) < eta) & maskable
        _, is_masked = sbd.add_noise(x, 1, maskable, torch.Generator().manual_seed(3), f)
        assert torch.equal(is_masked, expected)
    _, is_masked = sbd.add_noise(x, 1, maskable, torch.Generator().manual_seed(4), 1.0)
    assert torch.equal(is_masked, maskable), "f = 1: every maskable token masked"
    _, is_masked = sbd.add_noise(x, 1, maskable, torch.Generator().manual_seed(5), 0.5)
    whole = is_masked[:, 1:].all(dim=1).float().mean()  # 7 maskable tokens a row
    assert abs(whole - (0.5 + 0.5 / 8)) < 0.015, f"rows masked whole: {whole:.3f}"  # 4 SE


def test_block_phases_by_hand():
    """Rows whose answers start at 3, 5 and 8, k = 4: 'answer' puts a block start at the first
    answer token (3, 1, 0 mod 4), 'zero' at 0; 'random' is one draw per row in 0..k-1, the same for
    the same generator (a resumed run draws it again)."""
    answer = torch.zeros(3, 10, dtype=torch.bool)
    for row, first in enumerate((3, 5, 8)):
        answer[row, first:] = True
    assert sbd.block_phases(answer, 4, "answer").tolist() == [3, 1, 0]
    assert sbd.block_phases(answer, 4, "zero").tolist() == [0, 0, 0]
    draws = [sbd.block_phases(answer, 4, "random", torch.Generator().manual_seed(s))
             for s in (0, 0, 1)]
    assert torch.equal(draws[0], draws[1]) and all(((d >= 0) & (d < 4)).all() for d in draws)
    many = sbd.block_phases(torch.ones(4000, 2, dtype=torch.bool), 4, "random",
                            torch.Generator().manual_seed(2))
    assert torch.bincount(many, minlength=4).min() > 900  # every phase, about a quarter each


@pytest.mark.parametrize("block_phase", ["answer", "random", "zero"])
def test_leaving_out_the_unread_noisy_prompt_changes_nothing(block_phase):
    """With noise on the answer only, the noisy copies of the prompt are never labelled and (with
    the block holding the first answer token kept whole) never attended to: dropping them leaves
    every logit that is read (the clean half, the masked tokens) and the loss as they were in the
    full 2L forward."""
    m = random_model("gpt-tiny")
    B, L, P, k, mask_id = 4, 20, 7, 5, m.config.vocab_size - 1
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, mask_id, (B, L), generator=g)
    y = torch.randint(0, mask_id, (B, L), generator=g)
    answer = (torch.arange(L) >= P).expand(B, L)
    phases = {"answer": torch.full((B,), P % k), "random": torch.tensor([0, 1, 3, 4]),
              "zero": torch.zeros(B)}
    phases = phases[block_phase].long()
    full = sbd.sbd_inputs(x, y, mask_id, k, phases, answer, torch.Generator().manual_seed(1),
                          noisy_start=0)
    cut = sbd.sbd_inputs(x, y, mask_id, k, phases, answer, torch.Generator().manual_seed(1))
    s = 2 * L - cut[0].size(1)
    # dropped the prompt up to its block
    assert 0 < s <= P and (s == P) == (block_phase == "answer")
    assert torch.equal(cut[0], torch.cat([full[0][:, :L], full[0][:, L + s:]], dim=1))
    assert torch.equal(cut[3], torch.cat([full[3][:, :L], full[3][:, L + s:]], dim=1))
    keep = torch.cat([torch.arange(L), torch.arange(L + s, 2 * L)])
    # the mask is the full one without those slots
    assert torch.equal(cut[2], full[2][:, keep][:, :, keep])
    with torch.no_grad():
        full_logits, _ = m(full[0], pos=full[1], mask=full[2])
        cut_logits, _ = m(cut[0], pos=cut[1], mask=cut[2])
    read = torch.cat([torch.ones(B, L, dtype=torch.bool), cut[3][:, L:] != IGNORE_INDEX],
                     dim=1)  # (B, T)
    # (a noisy copy nobody reads may see fewer unread neighbours: not compared)
    assert read[:, L:].sum() > 20
    assert (cut_logits - full_logits[:, keep])[read].abs().max() <= 1e-5
    for a, b in zip(sbd.sbd_loss(full_logits, full[3], L), sbd.sbd_loss(cut_logits, cut[3], L)):
        assert a.item() == pytest.approx(b.item(), rel=1e-5)


# -----------------------------------------------------------------------------
# 8: the training forward and the decoding forward agree




def blocks_of(L, k, phase):
    """(start, end) of the noisy blocks covering 0..L-1 when blocks start at phase, phase ± k,
    ..."""
    return [(max(s, 0), min(s + k, L)) for s in range(phase - k if phase else 0, L, k)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k", [4, 5])
def test_training_forward_equals_decoding_forward(family, k):
    """Noisy block [s, e) of the 2L training forward == decoding: x[:s] in the KV cache, then the
    block x̂[s:e] on top (decode.hybrid_forward: hybrid mask, n_commit=0); and the same with
    x[s-1] committed in the block's forward, as the first forward of a decoded block does."""
    m = random_model(family)
    B, L, mask_id = 3, 14, m.config.vocab_size - 1
    g = torch.Generator().manual_seed(k)
    x = torch.randint(0, mask_id, (B, L), generator=g)
    phases = torch.tensor([0, 2, 3])  # per-row phases, one of them 0
    idx, pos, mask, _ = sbd.sbd_inputs(x, x, mask_id, k, phases, generator=g)
    noisy = idx[:, L:]
    is_masked = noisy == mask_id
    assert 0.2 < is_masked.float().mean() < 0.8, "want both masked and revealed block positions"
    with torch.no_grad():
        train_logits, _ = m(idx, pos=pos, mask=mask)  # (B, 2L, V)
        for b, phase in enumerate(phases.tolist()):
            for s, e in blocks_of(L, k, phase):
                expected = train_logits[b:b + 1, L + s:L + e]  # (1, e - s, V)
                cache = m.new_cache(1, L, "cpu")
                if s > 0:
                    m(x[b:b + 1, :s], cache=cache)
                got = decode.hybrid_forward(m, cache, noisy[b:b + 1, s:e], 0)
                assert (got - expected).abs().max() <= 1e-5, (
                    f"row {b} (phase {phase}), block {s}..{e}")
                if s > 0:
                    cache = m.new_cache(1, L, "cpu")
                    if s > 1:
                        m(x[b:b + 1, :s - 1], cache=cache)
                    tokens = torch.cat([x[b:b + 1, s - 1:s], noisy[b:b + 1, s:e]], dim=1)
                    got = decode.hybrid_forward(m, cache, tokens, 1)[:, 1:]
                    assert (got - expected).abs().max() <= 1e-5, (
                        f"row {b}, block {s}..{e}, committing x[s-1]")
        # the clean half is plain next-token prediction
        assert (train_logits[:, :L] - m(x)[0]).abs().max() <= 1e-5

# -----------------------------------------------------------------------------
# 9-11: train.py end to end


TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--sbd_batch_size=4"]


def train(*args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "train.py", "config/sbd_small.py", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_main_command_end_to_end(tmp_path):
    out = str(tmp_path / "out")
    t0 = time.time()
    run = train(f"--out_dir={out}", "--ntp_iters=30", "--sbd_iters=30", *TINY, "--log_interval=5",
                "--eval_interval=20", "--report_problems=20")
    assert run.returncode == 0, run.stderr[-3000:]
    assert time.time() - t0 < 60
    assert os.path.exists(f"{out}/ckpt_ntp.pt") and os.path.exists(f"{out}/ckpt_sbd.pt")
    assert "Table 1 on 20 held-out test problems" in run.stdout
    for row in ("NTP baseline", "SBD model, NTP decoding", "SBD k=8 γ_low", "SBD k=16 γ_high"):
        assert row in run.stdout
    log = read_log(out)
    assert [r["iter"] for r in log] == list(range(0, 60, 5))
    assert [r["stage"] for r in log] == ["ntp"] * 6 + ["sbd"] * 6
    assert [r["rows"] for r in log] == [8] * 6 + [4] * 6  # each stage its own batch size
    ntp, sbd_ = [r["loss"] for r in log[:6]], [r["loss"] for r in log[6:]]
    assert ntp[-1] < ntp[0] - 0.1 and sbd_[-1] < sbd_[0]
    _, checkpoint = checkpoint_lib.load_checkpoint(f"{out}/ckpt_sbd.pt")
    assert checkpoint["stage"] == "sbd" and checkpoint["mask_id"] == CharTask("addition").mask_id
    with open(f"{out}/calibration.json") as f:  # the report's γ choices, next to the checkpoint
        assert set(json.load(f)["k"]) == {"8", "16"}


@pytest.mark.slow
def test_shifted_complementary_run_end_to_end(tmp_path):
    """token_shift and complementary_masks train, are recorded in the checkpoint, and the report
    decodes with them: its exact rows are still the SBD model's NTP decoding, problem by problem."""
    out = str(tmp_path)
    run = train(f"--out_dir={out}", "--ntp_iters=20", "--sbd_iters=20", *TINY, "--log_interval=5",
                "--eval_interval=20", "--report_problems=10", "--token_shift=True",
                "--complementary_masks=True")
    assert run.returncode == 0, run.stderr[-3000:]
    _, checkpoint = checkpoint_lib.load_checkpoint(f"{out}/ckpt_sbd.pt")
    assert checkpoint["config"]["token_shift"] and checkpoint["config"]["complementary_masks"]
    assert "completions identical to the SBD model's NTP decoding on every test problem" in (
        run.stdout)


@pytest.mark.slow
def test_block_sizes_are_drawn_from_k_min_to_k_max(tmp_path):
    """SBD steps draw k in {k_min..k_max}, every value can come up; NTP steps draw one too (unused),
    and the NTP stage's batches do not depend on the k range, so SBD-stage experiments can share one
    NTP stage."""
    out = str(tmp_path)
    run = train(f"--out_dir={out}", "--ntp_iters=2", "--sbd_iters=12", *TINY, "--k_min=5",
                "--k_max=6", "--log_interval=1", "--eval_interval=100", "--report=False")
    assert run.returncode == 0, run.stderr[-3000:]
    ks = [r["k"] for r in read_log(out) if r["stage"] == "sbd"]
    assert len(ks) == 12 and set(ks) == {5, 6}
    other = str(tmp_path / "other")
    run = train(f"--out_dir={other}", "--ntp_iters=2", "--sbd_iters=0", *TINY, "--k_min=2",
                "--k_max=16", "--log_interval=1", "--report=False")
    assert run.returncode == 0, run.stderr[-3000:]
    ntp_losses = [[r["loss"] for r in read_log(d) if r["stage"] == "ntp"] for d in (out, other)]
    assert len(ntp_losses[0]) == 2 and ntp_losses[0] == ntp_losses[1]


RESUME = ["--ntp_iters=4", "--sbd_iters=4", *TINY, "--log_interval=1", "--eval_interval=2",
          "--report=False"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """starts_from -> the out_dir of RESUME's run with that sbd_starts_from, never halted."""
    runs = {}

    def run_for(starts_from):
        if starts_from not in runs:
            out = str(tmp_path_factory.mktemp(f"full-{starts_from}"))
            run = train(f"--out_dir={out}", *RESUME, f"--sbd_starts_from={starts_from}")
            assert run.returncode == 0, run.stderr[-3000:]
            runs[starts_from] = out
        return runs[starts_from]
    return run_for


def read_estimates(out):
    with open(f"{out}/eval.jsonl") as f:
        return [json.loads(line) for line in f]


# before, at and after the NTP -> SBD switch at iteration 4; 4 is also an estimate's iteration
@pytest.mark.parametrize("halt_after, starts_from", [(3, "ntp"), (4, "ntp"), (4, "init"),
                                                     (5, "init")])
@pytest.mark.slow
def test_resume_is_exact(tmp_path, uninterrupted, halt_after, starts_from):
    out, straight_dir = str(tmp_path), uninterrupted(starts_from)
    args = [*RESUME, f"--sbd_starts_from={starts_from}"]
    first = train(f"--out_dir={out}", *args, f"--halt_after={halt_after}")
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"halted after iteration {halt_after}" in first.stdout
    assert len(read_log(out)) == halt_after and not os.path.exists(f"{out}/ckpt_sbd.pt")
    second = train(f"--out_dir={out}", *args, "--init_from=resume")
    assert second.returncode == 0, second.stderr[-3000:]
    # iter, stage, loss and k of all 8 iterations, exactly; each estimate once, the same
    assert read_log(out) == read_log(straight_dir)
    assert read_estimates(out) == read_estimates(straight_dir)
    assert [e["iter"] for e in read_estimates(out)] == [2, 4, 6, 8]
    for name in ("ckpt_ntp.pt", "ckpt_sbd.pt"):
        resumed = torch.load(f"{out}/{name}", weights_only=False)["model"]
        straight = torch.load(f"{straight_dir}/{name}", weights_only=False)["model"]
        assert all(torch.equal(resumed[key], straight[key]) for key in straight), name


@pytest.mark.slow
def test_resume_refuses_other_data(tmp_path):
    """A run halted on one version of the data does not go on with another (the version its
    checkpoint recorded)."""
    first = train(f"--out_dir={tmp_path}", *RESUME, "--halt_after=3")
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = torch.load(f"{tmp_path}/ckpt_resume.pt", weights_only=True)
    assert checkpoint["data_version"] == CharTask("addition").data_version
    # as if data/addition had been made again by a changed prepare.py
    checkpoint["data_version"] = "0" * 16
    torch.save(checkpoint, f"{tmp_path}/ckpt_resume.pt")
    second = train(f"--out_dir={tmp_path}", *RESUME, "--init_from=resume")
    refusal = "ckpt_resume.pt was trained on another version of the data"
    assert second.returncode != 0 and refusal in second.stderr


@pytest.mark.parametrize("args, message", [
    (["--n_layr=2"], "unknown config key 'n_layr' in the command line; did you mean 'n_layer'?"),
    (["--dataset=nope"], "unknown dataset 'nope'"),
    (["--k_min=0"], "block sizes need 1 <= k_min <= k_max, got k_min=0, k_max=16"),
    (["--k_min=8", "--k_max=4"], "block sizes need 1 <= k_min <= k_max, got k_min=8, k_max=4"),
    (["--device=cuda:7"], "not available on this machine"),
    (["--init_from=nowhere"], "no pretrained model at 'nowhere'"),
    (["--block_phase=bogus"], "block_phase must be 'answer', 'random' or 'zero', got 'bogus'"),
    (["--ntp_weight=-1"], "ntp_weight, ntp_iters and sbd_iters must be >= 0"),
    (["--sbd_batch_size=-2"], "sbd_batch_size >= 0 (0 = batch_size), got 64, 1, -2"),
    (["--batch_size=-3"], "batch_size and gradient_accumulation_steps must be >= 1"),
    (["--ntp_weight=heavy"],
     "config key 'ntp_weight' in the command line must be float, got str 'heavy'"),
])
def test_bad_settings_are_clear_errors(tmp_path, args, message):
    run = train(f"--out_dir={tmp_path}", *args, "--ntp_iters=1", "--sbd_iters=0", "--report=False")
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr  # one line, no traceback
    assert "iter 0" not in run.stdout  # refused before any training
