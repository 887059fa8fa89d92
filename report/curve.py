"""
The SBD stage's learning curve: what more steps buy. train.py --snapshot_interval=n keeps the
weights every n SBD steps (out_dir/ckpt_sbd_step<s>.pt); this decodes each snapshot, and the final
ckpt_sbd.pt, on the same val problems and writes out_dir/curve.json and curve.png.

    python train.py config/sbd_smollm2.py config/sbd_smollm2_full.py config/sbd_smollm2_curve.py
    python -m report.curve --out_dir=out-sbd-smollm2-curve --benchmark=data/wordproblems/val.jsonl

Per snapshot, on the first `problems` rows held out of the benchmark (seed 0):
- masked-token val loss: train.py's estimate at that step (eval.jsonl), k = 8;
- NTP decoding accuracy of the snapshot itself;
- next-token decoding through the masked-token head: plain SBD with rule 'left' and γ = 0 reveals
  one slot per forward, left to right, each from the masked-token logits (slot 0 of a block from
  the causal head, as always);
- exact SBD's tokens per forward (every block drafted in one forward, its drafts checked from
  the first one the head gives less than `draft_floor`; 0 checks every draft);
- plain SBD's accuracy and tokens per forward at each γ of `gammas` (rule 'entropy').
`rows` picks which of them (ntp, left, exact, plain) each point decodes: a block adapter's NTP
decoding is its base's at every snapshot, so `--rows=("exact",)` reads its curve in a fraction of
the time. A snapshot already in curve.json is not decoded again, so an interrupted evaluation
continues. A curve at another draft floor goes to its own file (curve_floor0.5.json and .png), so
no floor's points overwrite another's.
"""

import glob
import json
import os
import re
import sys

import torch

from checkpoint import load_checkpoint, settings_for, write_json
from configurator import configure, pick_device, require, resolve_dtype
from pretrained.loading import tokenizer_of
from report.summary import pyplot
from sampling import ONE_FORWARD
from tasks import BenchmarkTask
from tasks.solve import solve, tokens_per_forward

ROWS = ("ntp", "left", "exact", "plain")  # NTP, the masked head left to right, exact SBD, plain SBD
OPTIONS = dict(
    out_dir="out-sbd-smollm2-curve",  # train.py's out_dir, with ckpt_sbd_step<s>.pt snapshots
    benchmark="data/wordproblems/val.jsonl",  # rows {"prompt", "answer"}: val, never test
    problems=64,  # val problems decoded per snapshot
    k=16,  # block size of every SBD mode
    draft_floor=0.0,  # exact SBD's min_draft_prob
    gammas=(0.01, 0.1),  # plain SBD's γ values
    rows=ROWS,  # what each point decodes
    answer_marker="####",
    max_new_tokens=128,
    batch_size=32,
    dtype="auto",  # bf16 where the CPU computes it natively
    device="",
)


def snapshots(out_dir):
    """[(SBD step, path)] of out_dir's snapshots and its final ckpt_sbd.pt, in step order."""
    found = {}
    final = os.path.join(out_dir, "ckpt_sbd.pt")
    if os.path.exists(final):  # the weights after the last step (mmap: only its header is read)
        c = torch.load(final, map_location="cpu", mmap=True, weights_only=True)
        found[c["iter_num"] - c["config"]["ntp_iters"]] = final
    for path in glob.glob(os.path.join(out_dir, "ckpt_sbd_step*.pt")):
        found[int(re.search(r"step(\d+)\.pt$", path).group(1))] = path
    return sorted(found.items())


def logged_losses(out_dir, ntp_iters):
    """{SBD step: masked-token val loss} from train.py's eval.jsonl ({"iter", "stage", "train":
    [NTP loss, masked-token loss], "val": [...]} per estimate)."""
    losses = {}
    path = os.path.join(out_dir, "eval.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if row["stage"] == "sbd":
                    losses[row["iter"] - ntp_iters] = row["val"][1]
    return losses


def evaluate_snapshot(model, checkpoint, task, o):
    """One curve point: accuracies and tokens per forward on the val problems."""
    problems = task.splits["val"]
    base = settings_for(checkpoint, gamma=0.0).replace(k=o["k"])

    def run(settings, ntp=False):
        return solve(model, task, problems, settings, ntp=ntp, batch_size=o["batch_size"])

    rows, point = o["rows"], dict(plain={})
    if {"ntp", "plain"} & set(rows):  # plain SBD's agreement counts against NTP's completions
        ntp = run(base, ntp=True)
        point["ntp_accuracy"] = ntp["accuracy"]
    if "left" in rows:
        point["left_accuracy"] = run(base.replace(rule="left"))["accuracy"]
    if "exact" in rows:
        exact = run(base.replace(gamma=ONE_FORWARD, exact=True, min_draft_prob=o["draft_floor"]))
        point.update(exact_tokens_per_forward=tokens_per_forward(exact),
                     exact_accuracy=exact["accuracy"])
    for g in o["gammas"] if "plain" in rows else ():
        r = run(base.replace(gamma=g))
        same = sum(a == b for a, b in zip(r["completions"], ntp["completions"]))
        point["plain"][str(g)] = dict(accuracy=r["accuracy"],
                                      tokens_per_forward=tokens_per_forward(r),
                                      agreement=100.0 * same / len(problems))
    return point


def plot(curve, path):
    """The curve as four panels against SBD steps; matplotlib is optional."""
    plt = pyplot("the curve as a picture")
    if plt is None:
        return None
    steps = [p["step"] for p in curve]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    loss = [(p["step"], p["masked_loss"]) for p in curve if p.get("masked_loss") is not None]
    if loss:
        axes[0].plot(*zip(*loss), "o-")
    axes[0].set_title("masked-token val loss (k=8)")
    if all("ntp_accuracy" in p for p in curve):
        axes[1].plot(steps, [p["ntp_accuracy"] for p in curve], "s--", color="gray", label="NTP")
    if all("left_accuracy" in p for p in curve):
        axes[1].plot(steps, [p["left_accuracy"] for p in curve], "o-",
                     label="masked-token head, one slot per forward")
    for g in curve[0]["plain"]:
        axes[1].plot(steps, [p["plain"][g]["accuracy"] for p in curve], "^-",
                     label=f"plain SBD γ={g}")
    axes[1].set_title("val accuracy (%)")
    if axes[1].lines:  # nothing there when rows holds no accuracy (an adapter's exact-only curve)
        axes[1].legend(fontsize=7)
    if all("exact_tokens_per_forward" in p for p in curve):
        axes[2].plot(steps, [p["exact_tokens_per_forward"] for p in curve], "*-",
                     label="exact SBD")
    for g in curve[0]["plain"]:
        axes[2].plot(steps, [p["plain"][g]["tokens_per_forward"] for p in curve], "^-",
                     label=f"plain SBD γ={g}")
    axes[2].set_title("tokens per forward")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("SBD steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv):
    o = dict(OPTIONS)
    configure(o, argv)
    require(o["problems"] >= 1 and o["batch_size"] >= 1 and o["k"] >= 1,
            "problems, batch_size and k must be >= 1")
    require(0 <= o["draft_floor"] <= 1,
            f"draft_floor: a probability in [0, 1], e.g. 0.5; got {o['draft_floor']}")
    require(o["rows"] and set(o["rows"]) <= set(ROWS),
            f"rows: some of {ROWS}, e.g. --rows=('exact',); got {o['rows']}")
    device = pick_device(o["device"])
    found = snapshots(o["out_dir"])
    require(found, f"no ckpt_sbd_step*.pt in {o['out_dir']}: train with --snapshot_interval=n")
    name = "curve" if o["draft_floor"] == 0 else f"curve_floor{o['draft_floor']:g}"
    out_path = os.path.join(o["out_dir"], name + ".json")
    curve = json.load(open(out_path)) if os.path.exists(out_path) else []
    done = {p["step"] for p in curve}
    for step, path in found:
        if step in done:
            continue
        model, checkpoint = load_checkpoint(path, device)
        model = model.to(getattr(torch, resolve_dtype(o["dtype"], device)))
        task = BenchmarkTask(o["benchmark"], tokenizer_of(checkpoint["tokenizer"]),
                             val_problems=o["problems"], max_new_tokens=o["max_new_tokens"],
                             answer_marker=o["answer_marker"])
        ntp_iters = checkpoint["config"]["ntp_iters"]
        point = dict(step=step, masked_loss=logged_losses(o["out_dir"], ntp_iters).get(step),
                     **evaluate_snapshot(model, checkpoint, task, o))
        print(json.dumps(point), flush=True)
        curve = sorted(curve + [point], key=lambda p: p["step"])
        write_json(out_path, curve)
    picture = plot(curve, os.path.join(o["out_dir"], name + ".png"))
    print(f"wrote {out_path}" + (f" and {picture}" if picture else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
