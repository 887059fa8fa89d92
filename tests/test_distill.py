"""Self-distilled targets (report/distill.py, train.py's sbd_responses) on a tiny random Llama: the
replaced rows hold the new responses, the file covers exactly the prompts stage 2 draws (train.py
refuses a step that draws one it lacks), and a resumed stage 2 trains on it."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from test_llama_sbd import PAIRS, ROOT, run, write_llama_dir, write_tokenizer

from model import IGNORE_INDEX
from report.distill import kept_responses
from tasks import JsonlTask


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("distill")
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return dict(tokenizer=str(write_tokenizer(d / "tokenizer.model")), jsonl=str(d / "pairs.jsonl"))


def test_with_responses_replaces_matched_prompts_only(files, tmp_path):
    task = JsonlTask(files["jsonl"], files["tokenizer"], seq_len=64)
    (first, _), (second, _) = task.splits["train"][:2]
    path = tmp_path / "own.jsonl"
    path.write_text(json.dumps(dict(prompt=first, response="forty-two")) + "\n")
    other = task.with_responses(str(path))
    assert task.splits["train"][0][1] != "forty-two"  # the task itself is unchanged
    x, y, answer = other.training_tensors("train", loss_on_answer_only=True)
    p = task.encode_prompt(first)
    assert x[0, len(p):len(p) + 9].tolist() == list(b"forty-two")
    assert answer[0].sum() == len("forty-two") + 1  # and the turn's end
    assert not answer[1].any() and (y[1] == IGNORE_INDEX).all()  # unanswered: nothing to learn
    assert task.encode_prompt(second) == x[1, :len(task.encode_prompt(second))].tolist()
    path.write_text(json.dumps(dict(prompt="not a training prompt", response="x")) + "\n")
    with pytest.raises(ValueError, match="none of its prompts"):
        task.with_responses(str(path))


@pytest.mark.slow
def test_stage_2_learns_the_ntp_models_own_solutions(files, tmp_path):
    write_llama_dir(tmp_path / "llama", "meta")
    out_dir = tmp_path / "out"
    args = ["config/sbd_llama8b.py", f"--init_from={tmp_path / 'llama'}",
            f"--dataset={files['jsonl']}", f"--out_dir={out_dir}", "--device=cpu",
            "--dtype=float32", "--fsdp=False", "--attention=sdpa", "--seq_len=48", "--batch_size=2",
            "--sbd_batch_size=2", "--gradient_accumulation_steps=1", "--ntp_iters=2",
            "--sbd_iters=3", "--sbd_starts_from=ntp", "--warmup_iters=1", "--eval_interval=3",
            "--eval_iters=1", "--log_interval=1"]  # a loss estimate in each stage
    run("train.py", *args, "--halt_after=2")  # stage 1, halted where stage 2 starts
    own = tmp_path / "own.jsonl"
    log = run("-m", "report.distill", f"--ckpt={out_dir / 'ckpt_ntp.pt'}", f"--out={own}",
              "--dtype=float32", "--device=cpu")
    # 3 steps x 2 rows drawn from 7 training prompts: each drawn prompt decoded once
    rows = [json.loads(line) for line in own.read_text().splitlines()]
    assert f": 6 draws, {len(rows)} distinct training prompts" in log
    prompts = {p["prompt"] for p in PAIRS}
    assert 1 <= len(rows) <= 6 and {r["prompt"] for r in rows} <= prompts
    assert len({r["prompt"] for r in rows}) == len(rows)
    # a file that lacks one drawn prompt is refused at the step that draws it
    shutil.copytree(out_dir, tmp_path / "copy")
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]) or "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "train.py", *args, f"--out_dir={tmp_path / 'copy'}",
                          "--init_from=resume", f"--sbd_responses={short}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 2 and "does not answer" in out.stderr
    # the whole file: stage 2 runs to its end
    log = run("train.py", *args, "--init_from=resume", f"--sbd_responses={own}")
    assert "iter 2 [sbd]" in log and "iter 4 [sbd]" in log and "saved the SBD model" in log


def test_keep_correct_keeps_the_solutions_with_the_right_final_answer():
    gold = ["2 + 3 = 5.\n#### 5", "7 * 6 = 42.\n#### 42", "10 - 4 = 6.\n#### 6", "no marker 9"]
    own = ["2 and 3 make 5\n#### 5.0", "7 * 6 = 42.\n#### 41", "10 - 4 = 6.", "it is 9"]
    # the third has no marker: its last number counts (6); the fourth: gold's last number (9)
    kept, n_right = kept_responses(own, gold, "correct", "####")
    assert n_right == 3 and kept == [own[0], gold[1], own[2], own[3]]
    assert kept_responses(own, gold, "all", "####") == (own, 3)
    assert kept_responses(["#### 5"], ["no number"], "correct", "####") == (["no number"], 0)
