"""JSONL benchmarks for an SBD-tuned Llama (tasks.BenchmarkTask, pretrained/loading.py,
evaluate.report):
answer extraction on hand-written cases, clear errors for malformed files, the val/test split,
left-padded batches == decoding each prompt alone, and evaluate.py end to end on a tiny random Llama
(Meta layout, written here with a byte-level tokenizer.model: the special tokens are ids 256..511)
and on a scripted model that knows every answer."""

import base64
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import evaluate
import tasks.solve as solve_lib
from checkpoint import save_checkpoint
from model import Llama, LlamaConfig
from pretrained.shapes import LLAMA_PRESETS
from sampling import DecodeSettings
from tasks import BenchmarkTask, final_answer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASK, EOT = 258, 265  # <|reserved_special_token_0|>, <|eot_id|> after 256 byte ranks
TINY = dict(LLAMA_PRESETS["llama-tiny"], vocab_size=512, rope_original_context=8192)  # Meta's rope
ROWS = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in
        [(11, 22), (30, 45), (17, 28), (52, 19), (60, 33), (24, 48), (71, 15), (38, 46), (13, 69),
         (55, 27)]]


# -----------------------------------------------------------------------------
# grading


@pytest.mark.parametrize("text, marker, want", [
    ("so the total is\n#### 42", "####", "42"),
    ("#### 42.\nI hope this helps! 7", "####", "42"),  # the first number after the marker
    ("3 apples; no marker here, 12", "####", "12"),  # no marker: the last number (flexible)
    (r"Hence $\boxed{3/4}$.", r"\boxed", "3/4"),
    (r"\boxed{\frac{3}{4}}", r"\boxed", "3/4"),  # LaTeX fractions read as a/b
    (r"\boxed{{2}+{3}} then 9", r"\boxed", "2"),  # nested braces: the content of the outer pair
    (r"\boxed{12", r"\boxed", "12"),  # braces never closed (a cut completion): everything after '{'
    ("The answer is 1,234.", "", "1234"),
    ("It costs $1,000.00 in total.", "", "1000"),
    ("about 1 234 567 people", "", "1234567"),
    ("the change is -5 degrees", "", "-5"),
    ("from 3-4 to x = -7.", "", "-7"),
    ("pages 3-4", "", "4"),  # a hyphen between numbers is no minus
    ("0.50", "", "1/2"), ("0.5", "", "1/2"), ("1/2", "", "1/2"),  # numbers compare by value
    ("no number at all", "", None),
    ("####", "####", None),
])
def test_final_answer(text, marker, want):
    assert final_answer(text, marker) == want


def test_text_answers_and_the_grader():
    assert final_answer(r"so \boxed{ Paris }.", r"\boxed", numeric=False) == "Paris"
    assert final_answer("  The answer: $x + 1$. ", "The answer:", numeric=False) == "x + 1"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    (d / "tokenizer.model").write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n"
                                               for b in range(256)))
    write_jsonl(d / "test.jsonl", ROWS + [{"prompt": "x" * 600, "answer": "1"}])  # past the context
    write_jsonl(d / "val.jsonl",
                [{"prompt": f"What is {a} - 1?", "answer": a - 1} for a in range(20, 26)]
                + [ROWS[0]])  # a test prompt in the val file: left out of val
    return d


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_is_correct(files):
    task = BenchmarkTask(str(files / "test.jsonl"), str(files / "tokenizer.model"),
                         answer_marker="####")
    assert task.is_correct("Add them: 30 + 45 = 75.\n#### 75<|eot_id|>", "75")
    assert task.is_correct("75", "#### 75") and task.is_correct("The answer is $75.00", "75")
    assert not task.is_correct("#### 76", "75")
    assert not task.is_correct("I don't know.<|eot_id|>", "75")
    assert not task.is_correct("<|reserved_special_token_75|>", "75")  # special tokens are not text


@pytest.mark.parametrize("line, why", [
    ('{"prompt": "hi", "answer": "1"', "not JSON"),
    ('{"prompt": "hi"}', 'expected {"prompt"'),
    ('{"prompt": 3, "answer": "1"}', 'expected {"prompt"'),
    ('["hi", "1"]', 'expected {"prompt"'),
    ('{"prompt": "hi", "answer": "none"}', "finds no answer"),
])
def test_malformed_lines_are_errors_naming_the_line(files, tmp_path, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + line + "\n" + json.dumps(ROWS[1]) + "\n")
    match = f"bad.jsonl:3: {why}" if why == "not JSON" else "bad.jsonl:3: .*" + why
    with pytest.raises(ValueError, match=match):
        BenchmarkTask(str(path), str(files / "tokenizer.model"))
    with pytest.raises(ValueError, match='"prompt".*"answer"'):
        BenchmarkTask(str(tmp_path / "nowhere.jsonl"), str(files / "tokenizer.model"))


def test_val_is_a_fixed_slice_never_the_test_set(files):
    tok = str(files / "tokenizer.model")
    task = BenchmarkTask(str(files / "test.jsonl"), tok, val_problems=4)
    val, test = task.splits["val"], task.splits["test"]
    assert len(val) == 4 and len(test) == 7 and not set(val) & set(test)
    assert sorted(val + test) == sorted([(r["prompt"], r["answer"]) for r in ROWS]
                                        + [("x" * 600, "1")])
    again = BenchmarkTask(str(files / "test.jsonl"), tok, val_problems=4)
    assert again.splits == task.splits  # seeded
    big_val = BenchmarkTask(str(files / "test.jsonl"), tok, val_problems=100).splits["val"]
    assert len(big_val) == 5  # at most half
    task = BenchmarkTask(str(files / "test.jsonl"), tok, str(files / "val.jsonl"), val_problems=100)
    assert len(task.splits["test"]) == 11 and len(task.splits["val"]) == 6  # ROWS[0]: a test prompt
    assert task.splits["val"][0] == ("What is 20 - 1?", "19")  # JSON numbers are answers too


# -----------------------------------------------------------------------------
# decoding a benchmark: left-padded batches, a tiny random Llama, a model that knows the answers


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    model = Llama(LlamaConfig(**TINY))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms away from 1
    return model.eval()


def test_left_padded_batches_decode_as_each_prompt_alone(files):
    """Prompts of 37..498 tokens in one batch (left-padded) give the completions and forward counts
    that each prompt gets alone, in every mode; the longest prompt's budget is cut to the model's
    context of 512."""
    task = BenchmarkTask(str(files / "test.jsonl"), str(files / "tokenizer.model"),
                         max_new_tokens=24)
    problems = task.splits["test"][:5] + [("y" * 475, "1"), ("What is 2 + 2? " * 3, "4"),
                                          ("What is 7 + 8?", "15")]
    model = tiny_llama()
    assert solve_lib.new_tokens(task, model, len(task.encode_prompt("y" * 475))) == 512 - 498
    fillers = [n_pad.tolist() for _, _, n_pad, _ in solve_lib.batches(task, model, problems, 8)]
    # the long prompt alone (its own budget), then by length
    assert fillers == [[0], [30, 28, 28, 28, 28, 28, 0]]
    base = DecodeSettings(mask_id=task.mask_id, stop_ids=task.stop_ids)
    for mode, k, gamma in [("ntp", 16, 0.0), ("sbd", 8, 0.5), ("sbd", 16, 2.0), ("exact", 8, 0.5)]:
        settings = base.replace(k=k, gamma=gamma, exact=mode == "exact")
        together = solve_lib.solve(model, task, problems, settings, mode == "ntp", batch_size=8)
        alone = solve_lib.solve(model, task, problems, settings, mode == "ntp", batch_size=1)
        assert together["completions"] == alone["completions"], mode
        assert together["forwards"] == alone["forwards"], mode
        assert together["tokens"] == alone["tokens"], mode


class Scripted(torch.nn.Module):
    """A model that knows every answer: whatever it is fed, its logits put (almost) all weight on
    the token that the prompt's scripted completion "The answer is <answer>.<|eot_id|>" has there (a
    causal slot predicts the next position, an SBD block slot its own). It finds each row's prompt
    in the prefill (after any filler)."""

    def __init__(self, model, task, problems):
        super().__init__()
        self.model, self.config, self.max_seq_len = model, model.config, model.max_seq_len
        self.script = {}
        for prompt, answer in problems:
            ids = task.encode_prompt(prompt)
            completion = task.tokenizer.encode(f"The answer is {answer}.") + [EOT]
            self.script[tuple(ids[:-1])] = ids + completion

    def new_cache(self, *args, **kwargs):
        return self.model.new_cache(*args, **kwargs)

    def find(self, row):
        """-> (the row's prompt + scripted completion, filler slots before it)."""
        for head, full in self.script.items():
            if tuple(row[len(row) - len(head):]) == head:
                return full, len(row) - len(head)
        raise KeyError("an unknown prompt")

    def forward(self, idx, pos=None, mask=None, cache=None, n_commit=None, block_start=None):
        B, T = idx.size()
        n_commit = T if n_commit is None else n_commit
        if not hasattr(cache, "script"):  # the prefill: every prompt but its last token
            cache.script = [self.find(row) for row in idx.tolist()]
        if pos is None:  # slot positions (no filler: LeftPadded passes positions of its own)
            pos = torch.arange(cache.length, cache.length + T)
        pos = pos.expand(B, T).tolist()
        logits = torch.zeros(B, T, self.config.vocab_size)
        for b, (full, _) in enumerate(cache.script):
            for t in range(T):
                at = pos[b][t] + (t < n_commit)  # the position this slot predicts
                logits[b, t, full[at] if at < len(full) else EOT] = 30.0
        cache.commit(n_commit)
        return logits, None


def write_run(directory, llama_dir, tokenizer):
    """An SBD-tuned tiny Llama's out_dir as train.py writes it (ckpt_sbd.pt), from llama_dir."""
    model = tiny_llama(seed=1)
    directory.mkdir()
    checkpoint = dict(model=model.state_dict(), model_family="llama",
                      model_args=dataclasses.asdict(model.config),
                      config=dict(init_from=str(llama_dir), dataset="pairs.jsonl"),
                      dataset="pairs.jsonl", tokenizer=dict(kind="llama", path=tokenizer),
                      iter_num=2, stage="sbd", mask_id=MASK, stop_ids=[257, 264, EOT])
    save_checkpoint(checkpoint, str(directory / "ckpt_sbd.pt"))
    return checkpoint


ROW_NAMES = ["NTP baseline", "SBD model, NTP decoding", "SBD k=8 γ_low", "SBD k=8 γ_high",
             "SBD exact k=8", "SBD k=16 γ_low", "SBD k=16 γ_high", "SBD exact k=16"]


def test_a_model_that_knows_the_answers_scores_100_percent(files, tmp_path, capsys):
    task = BenchmarkTask(str(files / "test.jsonl"), str(files / "tokenizer.model"), val_problems=4,
                         max_new_tokens=24)
    task.splits["test"] = task.splits["test"][:5]
    checkpoint = write_run(tmp_path / "run", "unused", str(files / "tokenizer.model"))
    scripted = Scripted(tiny_llama(), task, task.splits["val"] + task.splits["test"])
    rows, calibration, _ = evaluate.report(str(tmp_path / "run"),
                                           run=(scripted, scripted, checkpoint, task),
                                           exact_val_problems=2, timing_problems=2)
    out = capsys.readouterr().out
    assert "Table 1 on 5 held-out test problems of test.jsonl" in out
    names = ["NTP baseline", "SBD model, NTP decoding"]
    for k in (8, 16):  # every budget is met: each row is there, with its γ
        c = calibration[k]
        names += [f"SBD k={k} γ_low={c['low']:g}", f"SBD k={k} γ_high={c['high']:g}",
                  f"SBD exact k={k} γ={c['exact']:g}"]
    assert [name for name, _ in rows] == names
    assert all(r["accuracy"] == 100.0 for _, r in rows)
    assert all(r["forwards"] < rows[0][1]["forwards"] for _, r in rows[2:])  # whole blocks at once


@pytest.mark.parametrize("all_masked_rows, plain, has_plain_rows",
                         [(1.0, None, False), (1.0, True, True), (0.5, None, True),
                          (0.0, False, False)])
def test_plain_rows_are_left_out_for_a_model_trained_on_blocks_masked_whole(
        files, tmp_path, capsys, all_masked_rows, plain, has_plain_rows):
    """A model that never saw a partly revealed block gets exact rows only, unless asked."""
    task = BenchmarkTask(str(files / "test.jsonl"), str(files / "tokenizer.model"), val_problems=4,
                         max_new_tokens=24)
    task.splits["test"] = task.splits["test"][:3]
    checkpoint = write_run(tmp_path / "run", "unused", str(files / "tokenizer.model"))
    checkpoint["config"]["all_masked_rows"] = all_masked_rows
    scripted = Scripted(tiny_llama(), task, task.splits["val"] + task.splits["test"])
    rows, calibration, _ = evaluate.report(str(tmp_path / "run"), plain=plain,
                                           run=(scripted, scripted, checkpoint, task),
                                           exact_val_problems=2, timing_problems=2)
    out = capsys.readouterr().out
    names = [name for name, _ in rows]
    exact = [f"SBD exact k={k} γ={calibration[k]['exact']:g}" for k in (8, 16)]
    if has_plain_rows:
        assert len(names) == 8 and exact[0] in names and "plain SBD left out" not in out
    else:
        assert names == ["NTP baseline", "SBD model, NTP decoding", *exact]
        assert all(c["sweep"] == [] and c["low"] is None for c in calibration.values())
        assert ("plain SBD left out" in out) == (plain is None)  # said when decided for the user
        assert "no k has a γ" not in out


@pytest.mark.slow
def test_evaluate_py_on_a_jsonl_benchmark(files, tmp_path):
    """The command a GPU owner runs, on a CPU: the table, γ in the checkpoint, report.json; a random
    model answers (almost) nothing right, and the exact rows are its NTP decoding."""
    llama_dir = tmp_path / "llama"
    llama_dir.mkdir()
    keys = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
            "ffn_dim_multiplier", "norm_eps", "rope_theta", "use_scaled_rope")
    baseline = tiny_llama()
    params = {k: getattr(baseline.config, k) for k in keys}
    (llama_dir / "params.json").write_text(json.dumps(params))
    torch.save(baseline.state_dict(), llama_dir / "consolidated.00.pth")
    write_run(tmp_path / "run", llama_dir, str(files / "tokenizer.model"))
    out = subprocess.run(
        [sys.executable, "evaluate.py", f"--out_dir={tmp_path / 'run'}",
         f"--benchmark={files / 'test.jsonl'}", f"--val_benchmark={files / 'val.jsonl'}",
         "--device=cpu", "--max_new_tokens=12", "--val_problems=3", "--gamma_grid=(0.1, 0.6)",
         "--exact_val_problems=2", "--timing_problems=2", "--answer_marker=####"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout
    assert ("test.jsonl test: skipped 1 of 11 problems whose prompt is longer than the model's "
            "context") in log
    assert "γ calibrated on 3 rows of" in log
    assert "Table 1 on 10 held-out test problems of test.jsonl" in log
    for name in ROW_NAMES:
        assert name in log
    assert ("completions identical to the SBD model's NTP decoding on every test problem "
            "(checked)") in log
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["gamma_grid"] == [0.1, 0.6] and report["task"]["skipped"]["test"] == 1
    assert all(row["accuracy"] <= 10.0 for row in report["rows"] if "accuracy" in row)
    assert all(row["same_as_ntp"] == 10 for row in report["rows"]
               if row["name"].startswith("SBD exact"))
    calibration = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert set(calibration["k"]) == {"8", "16"}
    assert calibration["calibrated_on"].startswith("3 rows of")
    assert calibration["checkpoint"] == "ckpt_sbd.pt"  # and the checkpoint itself is left alone
