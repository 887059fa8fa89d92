"""
The Llama half of evaluate.py: load an SBD-tuned Llama run, the NTP model it started from, and a
JSONL benchmark with verifiable answers (task.BenchmarkTask), for evaluate.report to print the
paper's Table 1.

    python evaluate.py --out_dir=out-sbd-llama1b --benchmark=gsm8k_test.jsonl \
                       --val_benchmark=gsm8k_val.jsonl

The NTP baseline is the model the SBD run started from (the paper compares against it): the Llama
directory in the run's config (train.py's init_from), or --baseline=<directory or .pt>. On a GPU
both models decode in bf16.
"""

import os

import torch

from configurator import ConfigError
from load_llama import find_tokenizer, load_llama
from model import load_checkpoint
from task import BenchmarkTask


def load_run(out_dir, device, benchmark, val_benchmark="", baseline="", **task_settings):
    """-> (NTP baseline, SBD model, SBD checkpoint, task) for evaluate.report(run=...).
    task_settings: BenchmarkTask's (val_problems, max_new_tokens, answer_marker, numeric)."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32  # as sample.py
    sbd_model, checkpoint = load_checkpoint(os.path.join(out_dir, "ckpt_sbd.pt"), device)
    if checkpoint["model_family"] != "llama" or checkpoint["stage"] != "sbd":
        raise ConfigError(f"{out_dir}/ckpt_sbd.pt is not an SBD-tuned Llama (train.py with a "
                          ".jsonl dataset writes one); the small demo needs no --benchmark")
    sbd_model = sbd_model.to(dtype)  # FSDP checkpoints hold fp32 weights
    baseline = baseline or checkpoint["config"]["init_from"]
    ntp_model = load_baseline(baseline, device, dtype)
    tokenizer_path = checkpoint["tokenizer"]["path"]
    if not os.path.exists(tokenizer_path or "") and os.path.isdir(baseline):  # trained elsewhere
        tokenizer_path = find_tokenizer(baseline)
    task = BenchmarkTask(benchmark, tokenizer_path, val_benchmark or None, **task_settings)
    print(f"benchmark {task.name}: {len(task.splits['test'])} test problems; "
          f"γ calibrated on {task.info['val']}; graded by {describe_grader(task)}; "
          f"NTP baseline {baseline}")
    return ntp_model, sbd_model, checkpoint, task


def load_baseline(where, device, dtype):
    """The NTP model to compare against: a Llama checkpoint directory, or a train.py .pt file."""
    if where == "resume":  # a resumed run's config names no directory
        raise ConfigError("the run was resumed (its config says init_from='resume'): name the NTP "
                          "model it started from with --baseline=<Llama directory>")
    if where.endswith(".pt"):
        model, _ = load_checkpoint(where, device)
    else:
        model, _ = load_llama(where, device, dtype)
    return model.to(dtype).eval()


def describe_grader(task):
    where = (f"the first number after the last {task.answer_marker!r}, else " if task.answer_marker
             else "")
    return (f"{where}the last number of the completion, compared by value" if task.numeric else
            f"the text after the last {task.answer_marker!r}" if task.answer_marker else
            "the whole completion's text")
