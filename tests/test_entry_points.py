"""
Bad input at every entry point ends in one line that says what to do, never in a traceback: a
wrong setting, a missing file, a device that is not there. A bug still shows its traceback.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [
    (["train.py", "--batch_size=-3"], "batch_size"),
    (["train.py", "--n_layr=3"], "did you mean 'n_layer'"),
    (["train.py", "--device=cuda:5"], "not available"),
    (["train.py", "--init_from=nowhere"], "no pretrained model at 'nowhere'"),
    (["train.py", "--complementary_masks=True", "--sbd_iters=0"], "need sbd_iters > 0"),
    (["train.py", "--all_masked_rows=1.5"], "all_masked_rows is a fraction"),
    (["train.py", "--token_shift=True", "--k_min=1"], "use k_min >= 2"),
    (["train.py", "--token_shift=True", "--ntp_weight=0"], "keep the NTP term"),
    (["sample.py", "--out_dir=/nonexistent"], "no checkpoint at /nonexistent"),
    (["sample.py", "--gamma=oops"], "must be float"),
    (["sample.py", "--device=mps:1"], "not available"),
    (["evaluate.py", "--out_dir=/nonexistent"], "no checkpoint at /nonexistent"),
    (["evaluate.py", "--low_target=x"], "must be float"),
    (["-m", "bench", "--what=bogus"], "what must be one of"),
    (["-m", "bench", "--what=sbd", "--out_dir=/nonexistent", "--gamma=-1", "--n_layer=1",
      "--n_embd=32", "--n_head=2"], "gamma must be >= 0"),
    (["-m", "bench.roofline", "--hardware=abacus"], "hardware must be one of"),
    (["-m", "bench.gpu", "--device=cuda:7"], "not available"),
    (["-m", "bench.train_step", "--stage=both"], "stage must be 'sbd' or 'ntp'"),
    (["assignments/grade.py", "--assignments", "99"], "no assignment"),
]


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line(argv, message):
    run = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode != 0
    assert message in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_a_bug_still_shows_its_traceback(tmp_path):
    script = tmp_path / "buggy.py"
    script.write_text("import sys\nfrom configurator import configure\nx = 1\n"
                      "configure(globals(), sys.argv[1:])\n[][0]\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 1 and "Traceback" in run.stderr and "IndexError" in run.stderr


def one_line_error(argv, message):
    run = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode != 0 and message in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.slow
def test_a_cut_or_foreign_checkpoint_is_one_line(tmp_path):
    import torch

    whole = tmp_path / "whole.pt"
    torch.save({"model": {"w": torch.zeros(1000)}, "model_family": "gpt"}, whole)
    for name in ("ckpt_sbd.pt", "ckpt_ntp.pt"):
        (tmp_path / name).write_bytes(whole.read_bytes()[:2000])  # a copy cut short
    foreign = tmp_path / "foreign.pt"
    torch.save([1, 2, 3], foreign)  # another program's file
    for script in ("sample.py", "evaluate.py"):
        one_line_error([script, f"--out_dir={tmp_path}"], "is not a readable checkpoint")
    one_line_error(["sample.py", f"--ckpt={foreign}"], "is not a checkpoint of train.py")


@pytest.mark.parametrize("setting, message", [
    ("--gamma=-5", "gamma must be >= 0, or -1 for the calibrated one"),
    ("--temperature=-1", "temperature must be >= 0"),
    ("--top_p=1.5", "top_p must be in (0, 1]"),
    ("--k=-2", "k must be >= 1, or 0 for the calibrated one"),
])
def test_sample_settings_out_of_range_are_one_line(setting, message):
    one_line_error(["sample.py", "--out_dir=/nonexistent", setting], message)


@pytest.mark.parametrize("setting, message", [
    ("--low_target=2", "need 0 <= low_target <= high_target"),
    ("--ks=(0,)", "ks: block sizes must be >= 1"),
    ("--batch_size=-1", "batch_size must be >= 1"),
])
def test_evaluate_settings_out_of_range_are_one_line(setting, message, tmp_path):
    one_line_error(["evaluate.py", "--out_dir=/nonexistent", setting], message)
