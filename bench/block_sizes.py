"""
Exact SBD's batch-1 wall clock at several block sizes against NTP's, the way evaluate.py's
wall-clock row measures it (compiled, each decoder run once untimed, then timed one problem at a
time on the first test problems), every decoder once per rep, interleaved:

    python -m bench.block_sizes --out_dir=out-sbd-smollm2 --ks="(8,16)" --problems=10 --reps=3

On a CPU a forward's cost grows with its width (k + 1 slots after a rejected draft, 2k after a
kept block), so the block size with the most tokens per forward need not decode fastest; on a GPU
a few more slots cost almost nothing. Prints per decoder the seconds (median [min-max]), tokens
per forward, the speed-up over NTP per rep, and how many completions equal NTP's (bf16 near-ties
can differ; fp32 cannot).
"""

import sys

from bench.measure import cpu_name, spread
from checkpoint import settings_for
from configurator import configure, pick_device
from evaluate import OPTIONS as REPORT_OPTIONS
from evaluate import fast_decoding
from pretrained.loading import load_run
from report.views import exact_settings
from sampling import ONE_FORWARD
from tasks.solve import solve, tokens_per_forward

# -----------------------------------------------------------------------------
out_dir = "out-sbd-smollm2"  # a run with ckpt_ntp.pt and ckpt_sbd.pt (train.py's out_dir)
benchmark = "data/wordproblems/test.jsonl"  # the report's test problems
val_benchmark = "data/wordproblems/val.jsonl"  # held apart (unused here), as the report holds it
ks = (8, 16)  # exact SBD's block sizes
draft_floor = 0.5  # min_draft_prob (the config's calibrated choice)
problems = 10  # the first test problems, one at a time
reps = 3  # interleaved repetitions
max_new_tokens = 128
dtype = "auto"  # bf16 where the device computes it natively
device = ""
# -----------------------------------------------------------------------------


def main():
    configure(globals(), sys.argv[1:])
    dev = pick_device(device)
    ntp_model, sbd_model, checkpoint, task = load_run(
        out_dir, dev, benchmark, val_benchmark, "", dtype, val_problems=1,
        max_new_tokens=max_new_tokens, answer_marker="####", numeric=True)
    _, compiled = fast_decoding([ntp_model, sbd_model], checkpoint,
                                dict(REPORT_OPTIONS, compile=None, weights="auto"))
    base = settings_for(checkpoint, gamma=0.0, compiled=compiled)
    test = task.splits["test"][:problems]
    decoders = {"NTP": (ntp_model, base, True)}
    for k in ks:
        chosen = dict(exact=ONE_FORWARD, exact_floor=draft_floor)  # as evaluate.py calibrates
        decoders[f"exact SBD k={k}"] = (sbd_model, exact_settings(base, k, chosen), False)
    per_forward, completions = {}, {}
    for name, (model, settings, ntp) in decoders.items():  # untimed: compiles every width
        r = solve(model, task, test, settings, ntp=ntp, batch_size=1)
        per_forward[name], completions[name] = tokens_per_forward(r), r["completions"]
    seconds = {name: [] for name in decoders}
    for rep in range(reps):
        for name, (model, settings, ntp) in decoders.items():
            seconds[name].append(solve(model, task, test, settings, ntp=ntp,
                                       batch_size=1)["seconds"])
        print(f"rep {rep + 1}/{reps}: " + ", ".join(f"{name} {s[-1]:.2f} s"
                                                   for name, s in seconds.items()), flush=True)
    print(f"\n{cpu_name()}, {next(sbd_model.parameters()).dtype}, "
          f"{'compiled' if compiled else 'eager'}, batch 1, first {len(test)} test problems, "
          f"draft floor {draft_floor}:")
    for name in decoders:
        speedups = [a / b for a, b in zip(seconds["NTP"], seconds[name])]
        same = sum(a == b for a, b in zip(completions[name], completions["NTP"]))
        print(f"{name:>16}: {spread(seconds[name])} s, {per_forward[name]:.2f} tokens per "
              f"forward, {spread(speedups)}x NTP's speed, {same} of {len(test)} completions NTP's")


if __name__ == "__main__":
    main()
