"""
Levers side by side at equal minutes: the learning curves of several SBD runs of one model on one
data set (each run's snapshots, train.py --snapshot_interval=n, and its final weights), read out
as report/screen.py reads a checkpoint, against the minutes of SBD steps each run spent.

    python -m report.levers --runs=out-paper,out-shift,out-comp \\
        --seconds_per_step=(2.28,2.28,3.03) --labels=paper,shift,shift+complementary

Per point: the masked-token loss and the leading run of correct drafts of the read-out (256 val
answers, blocks of k, every block position 1 on read where the run's alignment says), and exact
SBD's tokens per forward on the first decode_problems val problems (each block drafted in one
forward). A run's points are kept in <run>/levers.json, so a later call only reads new snapshots.
seconds_per_step comes from a timing of the runs' steps side by side (the step time of train.py's
log depends on what else the machine ran). The picture goes to --picture.
"""

import json
import os
import sys

import torch

from checkpoint import load_checkpoint, write_json
from configurator import configure, pick_device, require, resolve_dtype
from pretrained.loading import tokenizer_of
from report.curve import snapshots
from report.screen import decode_val, read_out, summarize
from report.summary import pyplot
from tasks import task_of_checkpoint

OPTIONS = dict(
    runs="",  # train.py out_dirs, one per lever, separated by commas
    labels="",  # their names in the picture, separated by commas (default: the directories')
    seconds_per_step=(),  # each run's SBD step time, measured side by side
    problems=256,  # val answers read out
    k=8,
    batch_size=8,
    benchmark="data/wordproblems/val.jsonl",  # val problems decoded by exact SBD
    decode_problems=64,
    answer_marker="####",
    dtype="auto",
    device="",
    picture="levers.png",
    first_step=1,  # snapshots from this SBD step on (step 0 is the model before SBD training)
)


def read_point(path, o, device, autocast):
    """One snapshot: the read-out's masked-token loss and leading run, exact tokens per forward."""
    model, checkpoint = load_checkpoint(path, device)
    tokenizer = tokenizer_of(checkpoint["tokenizer"])
    x, _, answer = task_of_checkpoint(checkpoint, path, tokenizer).training_tensors("val", True)
    r = read_out(model, checkpoint, x[:o["problems"]], answer[:o["problems"]], o["k"], autocast,
                 o["batch_size"])
    point, _ = summarize(path, r, o["k"])
    decoded = decode_val(model, checkpoint, tokenizer, dict(o, draft_floors=(0.0,)),
                         resolve_dtype(o["dtype"], device))
    return dict(masked_loss=point["masked_loss"], leading_run=point["leading_run"],
                ntp_val_accuracy=decoded["ntp_val_accuracy"],
                exact_tokens_per_forward=decoded["exact"]["0.0"]["tokens_per_forward"])


def curve_of(run, o, device, autocast):
    """[{step, masked_loss, ...}] of a run, read where not read before (run/levers.json)."""
    path = os.path.join(run, "levers.json")
    points = json.load(open(path)) if os.path.exists(path) else []
    done = {p["step"] for p in points}
    for step, snapshot in snapshots(run):
        if step >= o["first_step"] and step not in done:
            points = sorted(points + [dict(step=step, **read_point(snapshot, o, device,
                                                                   autocast))],
                            key=lambda p: p["step"])
            write_json(path, points)
    return points


def plot(curves, path):
    """Masked-token loss and exact tokens per forward against minutes of SBD steps."""
    plt = pyplot("the curves as a picture")
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, points in curves.items():
        minutes = [p["minutes"] for p in points]
        axes[0].plot(minutes, [p["masked_loss"] for p in points], "o-", label=label)
        axes[1].plot(minutes, [p["exact_tokens_per_forward"] for p in points], "o-", label=label)
    axes[0].set_title("masked-token val loss, block positions 1 on")
    axes[1].set_title("exact SBD tokens per forward (val)")
    for ax in axes:
        ax.set_xlabel("minutes of SBD steps")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv):
    o = configure(dict(OPTIONS), argv)
    runs = [r for r in o["runs"].split(",") if r]
    labels = o["labels"].split(",") if o["labels"] else [os.path.basename(r) for r in runs]
    require(runs and len(labels) == len(runs) == len(o["seconds_per_step"]),
            "--runs, --seconds_per_step (and --labels, if given) name one entry per run")
    device = pick_device(o["device"])
    bf16 = resolve_dtype(o["dtype"], device) == "bfloat16"
    autocast = torch.autocast(device.split(":")[0], torch.bfloat16, enabled=bf16)
    curves = {}
    for run, label, seconds in zip(runs, labels, o["seconds_per_step"]):
        points = curve_of(run, o, device, autocast)
        curves[label] = [dict(p, minutes=p["step"] * seconds / 60) for p in points]
    print(f"{'run':24s} {'SBD step':>8s} {'minutes':>8s} {'masked loss':>11s} "
          f"{'leading run':>11s} {'exact tok/fwd':>13s} {'NTP val':>8s}")
    for label, points in curves.items():
        for p in points:
            print(f"{label:24s} {p['step']:8d} {p['minutes']:8.1f} {p['masked_loss']:11.3f} "
                  f"{p['leading_run']:11.3f} {p['exact_tokens_per_forward']:13.2f} "
                  f"{p['ntp_val_accuracy']:7.1f}%")
    picture = plot(curves, o["picture"])
    print(f"wrote {picture}" if picture else "")
    return curves


if __name__ == "__main__":
    main(sys.argv[1:])
