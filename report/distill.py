"""
Self-distilled targets for the SBD stage: an NTP fine-tune's own greedy solutions to the training
prompts that stage 2 will draw, written as {"prompt", "response"} pairs for train.py's
sbd_responses; with --keep=correct only the solutions whose final answer is right, the dataset's
own response elsewhere.

    python train.py config/sbd_smollm2.py --sbd_starts_from=ntp --halt_after=450 --out_dir=<run>
    python -m report.distill --ckpt=<run>/ckpt_ntp.pt --out=<run>/own.jsonl
    python train.py config/sbd_smollm2.py --sbd_starts_from=ntp --init_from=resume \
        --out_dir=<run> --sbd_responses=<run>/own.jsonl

Why: exact SBD keeps a drafted token only where it equals the model's own next-token argmax, so
what the masked-token head must learn to predict is the model's own writing, not the reference
solution's wording. Training on the model's own solutions aims the head at that target (and costs
the decoding time printed here).

Which prompts: train.py draws each step's rows from a generator seeded by (seed, rank, iteration),
k first and then the rows, so the rows of SBD steps [ntp_iters, ntp_iters + sbd_iters) are known
in advance; only those are decoded (--rows=all decodes every training prompt). The run settings
(dataset, seq_len, seed, steps, batch sizes, k range) are read from the checkpoint's config; pass
them to override. train.py refuses a step that draws a prompt the file does not answer.
"""

import json
import os
import sys
import time

import torch

from configurator import ConfigError, configure, pick_device, require, resolve_dtype
from model import load_checkpoint
from pretrained.loading import tokenizer_of
from sampling import settings_for
from tasks import JsonlTask, check_same_data, final_answer, step_generator
from tasks.solve import decode_batches

OPTIONS = dict(
    ckpt="",  # the teacher: a train.py NTP checkpoint (ckpt_ntp.pt) of a chat dataset
    out="",  # the .jsonl to write (atomically)
    rows="drawn",  # 'drawn': the prompts stage 2 will draw; 'all': every training prompt
    keep="all",  # 'correct': a solution only if its final answer is the dataset response's
    answer_marker="####",  # keep='correct': the final answer is the first number after it
    seed=-1, ntp_iters=-1, sbd_iters=-1, sbd_batch_size=-1, k_min=-1, k_max=-1,  # -1: the run's
    batch_size=32,  # prompts decoded together
    dtype="auto",  # bf16 where the device computes it natively
    device="",
)


def stage_2_rows(n_rows, seed, ntp_iters, sbd_iters, rows, k_min, k_max):
    """The training rows SBD steps [ntp_iters, ntp_iters + sbd_iters) of a one-process train.py
    run draw, in order: each step's generator gives its k, then its rows (train.py's loop)."""
    drawn = []
    for it in range(ntp_iters, ntp_iters + sbd_iters):
        rng = step_generator(seed, 0, it)
        torch.randint(0, k_max - k_min + 1, (1,), generator=rng)  # the step's k
        drawn += torch.randint(n_rows, (rows,), generator=rng).tolist()
    return drawn


def kept_responses(own, gold, keep, marker):
    """The responses to write -> (responses, how many of own give gold's final answer). keep:
    'all' keeps own; 'correct' keeps an own response only where its final answer is gold's (the
    first number after marker), else gold's."""
    right = []
    for mine, theirs in zip(own, gold):
        want = final_answer(theirs, marker)
        right.append(want is not None and final_answer(mine, marker) == want)
    if keep == "correct":
        own = [mine if ok else theirs for mine, ok, theirs in zip(own, right, gold)]
    return list(own), sum(right)


def run_settings(checkpoint, o):
    """The run's settings from the checkpoint's config, each overridable by a non-negative
    option."""
    config = checkpoint["config"]
    keys = ("seed", "ntp_iters", "sbd_iters", "sbd_batch_size", "k_min", "k_max")
    run = {key: o[key] if o[key] >= 0 else config[key] for key in keys}
    run["sbd_batch_size"] = run["sbd_batch_size"] or config["batch_size"]
    if config.get("gradient_accumulation_steps", 1) != 1:
        raise ConfigError("with gradient_accumulation_steps > 1 a step's later rows depend on its "
                          "noise: use --rows=all")
    return run


def main(argv):
    o = dict(OPTIONS)
    configure(o, argv)
    require(o["ckpt"] and o["out"], "name the teacher and the file: --ckpt=<run>/ckpt_ntp.pt "
            "--out=<file>.jsonl")
    require(o["rows"] in ("drawn", "all"), f"rows must be 'drawn' or 'all', got {o['rows']!r}")
    require(o["keep"] in ("all", "correct"), f"keep must be 'all' or 'correct', got {o['keep']!r}")
    device = pick_device(o["device"])
    model, checkpoint = load_checkpoint(o["ckpt"], device)
    if checkpoint["model_family"] != "llama":
        raise ConfigError(f"{o['ckpt']}: not a chat model's checkpoint (train.py on .jsonl pairs)")
    model = model.to(getattr(torch, resolve_dtype(o["dtype"], device))).eval()
    task = JsonlTask(checkpoint["dataset"], tokenizer_of(checkpoint["tokenizer"]),
                     checkpoint["config"]["seq_len"])
    check_same_data(checkpoint, task, o["ckpt"])
    pairs = [pair for pair in task.splits["train"]  # row i of train.py's data holds pairs[i]
             if task.has_row(task.encode_prompt(pair[0]))]
    if o["rows"] == "all":
        chosen = range(len(pairs))
    else:
        run = run_settings(checkpoint, o)
        drawn = stage_2_rows(len(pairs), run["seed"], run["ntp_iters"], run["sbd_iters"],
                             run["sbd_batch_size"], run["k_min"], run["k_max"])
        chosen = sorted(set(drawn))
        print(f"stage 2 of {run}: {len(drawn)} draws, {len(chosen)} distinct training prompts")
    problems = [pairs[i] for i in chosen]
    settings = settings_for(checkpoint, gamma=0.0)  # greedy NTP: the teacher's argmax
    responses, unfinished, t0 = [None] * len(problems), 0, time.perf_counter()
    for indices, out, _ in decode_batches(model, task, problems, settings, o["batch_size"],
                                          ntp=True):
        for i, ids in zip(indices, out):
            finished = bool(ids) and ids[-1] in settings.stop_ids
            unfinished += not finished
            responses[i] = task.decode(ids[:-1] if finished else ids)
    seconds = time.perf_counter() - t0
    print(f"decoded {len(problems)} prompts in {seconds:.0f} s ({unfinished} did not end within "
          f"{task.max_new_tokens} tokens)")
    responses, n_right = kept_responses(responses, [gold for _, gold in problems], o["keep"],
                                        o["answer_marker"])
    print(f"{n_right} of {len(problems)} solutions ({100 * n_right / len(problems):.1f}%) give "
          "the dataset response's final answer")
    tmp = o["out"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for (prompt, _), response in zip(problems, responses):
            f.write(json.dumps(dict(prompt=prompt, response=response)) + "\n")
    os.replace(tmp, o["out"])
    print(f"wrote {o['out']}")


if __name__ == "__main__":
    main(sys.argv[1:])
