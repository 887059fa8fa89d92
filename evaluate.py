"""
The paper's Table 1 for a model with verifiable answers: accuracy and NFE speed-up of SBD vs NTP.

    python evaluate.py --out_dir=out-sbd-small        (train.py runs this at the end of the demo)
    python evaluate.py --out_dir=out-sbd-llama1b --benchmark=gsm8k_test.jsonl
                       (an SBD-tuned Llama on a JSONL benchmark, against the Llama it started from)

1. Calibrate γ on the val split (never test), for each block size k: a sweep upward over a grid.
   γ_low is the largest γ such that no γ up to it loses more than low_target points of val
   accuracy against NTP decoding (the better of the NTP baseline's and the SBD model's own; γ_high:
   high_target points). "No γ up to it", not "this γ": the sweep is noisy and not monotone. Each
   budget is half the loss its row may show on test, because the largest γ that passes a noisy
   sweep passes partly by luck (docs/findings.md, γ is calibrated per model). A budget no γ meets
   with fewer forwards than NTP gets no row. The exact mode needs no budget (its accuracy is NTP's
   by construction): its γ is the one with the most tokens per forward on val. The choices go to
   out_dir/calibration.json (settings.py), the whole report to out_dir/report.json.
2. On the test split: NTP accuracy of the NTP baseline and of the SBD model itself; SBD at γ_low
   and γ_high and exact SBD for each k (exact completions must equal the SBD model's NTP
   decoding: checked); wall clock of NTP, SBD and exact SBD decoding one problem at a time.
3. One test problem step by step, plain and exact; the γ sweep as a picture (out_dir/sweep.png,
   with matplotlib installed).
NFE speed-up = (forwards NTP decoding needed for the test set) / (forwards SBD decoding needed),
every row decoded until its own stop token. Prompts of different lengths are decoded together,
left-padded (LeftPadded); every problem gets the same token budget in every mode.
"""

import json
import os
import platform
import re
import sys
import time

import torch

from configurator import configure, pick_device
from exact import decode
from generate import format_steps
from model import load_checkpoint
from pretrained.loading import load_baseline, load_models, load_run, pretrained_path
from sampling import settings_for, write_calibration
from tasks import CharTask, task_of_checkpoint
from tasks.solve import mode_name, new_tokens, skip_long_prompts, solve

# below 3e-4: ~1 token/forward. Dense at the low end, where a well-trained model's tokens per
# forward climb steeply and γ_low usually lies
GAMMA_GRID = [3e-4, 5e-4, 7e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 0.01, 0.02, 0.03, 0.05, 0.1, 0.3,
              1.0]
SATURATED = 1.02  # the sweep stops once a larger γ gains less than 2% tokens per forward
# a real model is far less over-confident: around the paper's γ (reasoning 0.1 / 0.35, chat 0.35 /
# 0.6; docs/method.md, The paper's results)
LLAMA_GAMMA_GRID = [0.05, 0.1, 0.2, 0.35, 0.5, 0.6, 0.8, 1.0]
EXACT_GRID = [0.01, 0.1, 1.0, 1e9]  # 1e9: every masked token at once, one forward per block
# settings left unset: the demo decodes a problem in milliseconds on a CPU, a Llama on a benchmark
# in seconds on a GPU, so there the batch-1 parts (the exact mode's γ, the wall clock) use fewer
# problems
DEFAULTS = dict(small=dict(grid=GAMMA_GRID, batch_size=250, exact_val_problems=200,
                           timing_problems=200),
                benchmark=dict(grid=LLAMA_GAMMA_GRID, batch_size=64, exact_val_problems=50,
                               timing_problems=20))
def tokens_per_forward(r):
    return r["tokens"] / max(r["forwards"], 1)


def within_budget(sweep, floor):
    """The largest γ of an upward sweep [(γ, result)] such that every γ up to it keeps val accuracy
    >= floor, if it decodes with fewer forwards than NTP (tokens per forward > 1); else None."""
    passed = []
    for g, r in sweep:
        if r["accuracy"] < floor:
            break
        passed.append((g, r))
    return passed[-1][0] if passed and tokens_per_forward(passed[-1][1]) > 1 else None


def calibrate(model, task, base, ntp_val_accuracy, k, low_target, high_target, grid=GAMMA_GRID,
              batch_size=250, exact_val_problems=200, exact_batch_size=1, exact_grid=EXACT_GRID):
    """-> dict(low=γ or None, high=γ or None, exact=γ, sweep=[(γ, val acc, tok/fwd)],
    exact_sweep=[(γ, tok/fwd)]). base: the DecodeSettings every γ of the sweep starts from."""
    val, sweep = task.splits["val"], []
    for g in grid:  # upward, and no further than a γ could still be chosen and gain something:
        r = solve(model, task, val, base.replace(k=k, gamma=g), batch_size=batch_size)
        sweep.append((g, r))
        print(f"  calibrate k={k:2d} γ={g:<7g} val accuracy {r['accuracy']:6.2f}%  "
              f"{tokens_per_forward(r):5.2f} tokens/forward")
        if r["accuracy"] < ntp_val_accuracy - high_target:
            break  # no larger γ can be chosen (the rule of within_budget)
        if len(sweep) > 1 and tokens_per_forward(r) < SATURATED * tokens_per_forward(sweep[-2][1]):
            break  # a larger γ would only add risk: the block is about as fast as it gets
    exact_sweep = []
    for g in exact_grid:
        settings = base.replace(k=k, gamma=g, exact=True)
        r = solve(model, task, val[:exact_val_problems], settings, batch_size=exact_batch_size)
        exact_sweep.append((g, r))
        print(f"  calibrate exact k={k:2d} γ={g:<7g} {tokens_per_forward(r):5.2f} tokens/forward "
              f"({r['rejected']} drafts rejected on {min(len(val), exact_val_problems)} val "
              "problems)")
    return dict(low=within_budget(sweep, ntp_val_accuracy - low_target),
                high=within_budget(sweep, ntp_val_accuracy - high_target),
                exact=max(exact_sweep, key=lambda gr: tokens_per_forward(gr[1]))[0],
                sweep=[(g, r["accuracy"], tokens_per_forward(r)) for g, r in sweep],
                exact_sweep=[(g, tokens_per_forward(r)) for g, r in exact_sweep])


def table_rows(ntp_model, sbd_model, task, base, calibration, budgets, batch_size=250,
               exact_batch_size=1):
    """Table 1 on test -> [(name, result)]; a budget no γ met is a row with result None.
    An exact row's result also counts the problems whose completion equals the SBD model's NTP
    decoding."""
    test = task.splits["test"]
    baseline = solve(ntp_model, task, test, base, ntp=True, batch_size=batch_size)
    sbd_ntp = solve(sbd_model, task, test, base, ntp=True, batch_size=batch_size)
    rows = [("NTP baseline", baseline), ("SBD model, NTP decoding", sbd_ntp)]
    for k, chosen in calibration.items():
        decoded = {}  # γ -> result: γ_low and γ_high are often one γ, decoded once
        for name in ("low", "high"):
            g = chosen[name]
            if g is not None and g not in decoded:
                decoded[g] = solve(sbd_model, task, test, base.replace(k=k, gamma=g),
                                   batch_size=batch_size)
            rows.append((f"SBD k={k} γ_{name}={g:g}" if g is not None else
                         f"SBD k={k} γ_{name}: no γ within {budgets[name]} points on val",
                         decoded.get(g)))
        exact = solve(sbd_model, task, test, base.replace(k=k, gamma=chosen["exact"], exact=True),
                      batch_size=exact_batch_size)
        same = sum(a == b for a, b in zip(exact["completions"], sbd_ntp["completions"]))
        exact["same_as_ntp"] = same
        # the point of the exact mode: never let a difference pass unnoticed. In fp32 a batch row
        # and a lone row round alike, so a difference is a bug; in bf16 the batched NTP decoding
        # may break a near-tie the other way: print_table counts those under the table
        if same != len(test) and next(sbd_model.parameters()).dtype == torch.float32:
            raise RuntimeError(f"exact SBD k={k} differs from the SBD model's NTP decoding on "
                               f"{len(test) - same} of {len(test)} test problems")
        rows.append((f"SBD exact k={k} γ={chosen['exact']:g}", exact))
    return rows


def print_table(rows, task):
    baseline = rows[0][1]
    print(f"\nTable 1 on {len(task.splits['test'])} held-out test problems of {task.name} "
          "(greedy decoding):")
    print(f"{'':34s} {'accuracy':>9s} {'Δ vs NTP':>9s} {'forwards':>9s} {'tok/fwd':>8s} "
          f"{'NFE speed-up':>13s}")
    for name, r in rows:
        if r is None:
            print(f"{name}")
            continue
        print(f"{name:34s} {r['accuracy']:8.2f}% {r['accuracy'] - baseline['accuracy']:+9.2f} "
              f"{r['forwards']:9d} {tokens_per_forward(r):8.2f} "
              f"{baseline['forwards'] / r['forwards']:12.2f}x")
    n = len(task.splits["test"])
    exact = [(name, r["same_as_ntp"]) for name, r in rows if name.startswith("SBD exact")]
    if exact and all(same == n for _, same in exact):
        print("exact rows: completions identical to the SBD model's NTP decoding on every test "
              "problem (checked)")
    else:  # bf16 only (table_rows raises in fp32)
        for name, same in exact:
            print(f"{name}: completions identical to the SBD model's batched NTP decoding on "
                  f"{same} of {n} test problems (bf16: batched and lone decoding round "
                  "differently and can break a near-tie the other way)")


def row_key(name):
    """A row's name without its γ value ('SBD k=16 γ_low=0.01' -> 'SBD k=16 γ_low'), so that runs
    whose calibration chose other values still compare row by row (seeds.py)."""
    return re.sub(r" γ=\S+$", "", re.sub(r"(γ_low|γ_high)(=\S+|: .*)$", r"\1", name))


def operating_point(calibration):
    """The k whose γ_low decodes with the fewest forwards on val, or None if no k has one."""
    speed = {k: dict((g, tpf) for g, _, tpf in c["sweep"])[c["low"]]
             for k, c in calibration.items() if c["low"] is not None}
    return max(speed, key=speed.get) if speed else None


def exact_operating_point(calibration):
    """The k whose exact mode decodes with the fewest forwards on val."""
    return max(calibration, key=lambda k: max(tpf for _, tpf in calibration[k]["exact_sweep"]))


def wall_clock(ntp_model, sbd_model, task, base, calibration, k, k_exact, n):
    """Seconds to decode the first n test problems one at a time: NTP, SBD at k's γ_low (k None:
    no γ_low on val), exact SBD at k_exact."""
    problems = task.splits["test"][:n]
    wall = {"ntp": solve(ntp_model, task, problems, base, ntp=True, batch_size=1)["seconds"]}
    parts = [f"NTP {wall['ntp']:.2f} s"]
    if k is not None:
        g = calibration[k]["low"]
        settings = base.replace(k=k, gamma=g)
        wall["sbd"] = solve(sbd_model, task, problems, settings, batch_size=1)["seconds"]
        parts.append(f"SBD k={k} γ={g:g} {wall['sbd']:.2f} s ({wall['ntp'] / wall['sbd']:.2f}x)")
    g = calibration[k_exact]["exact"]
    settings = base.replace(k=k_exact, gamma=g, exact=True)
    wall["exact"] = solve(sbd_model, task, problems, settings, batch_size=1)["seconds"]
    parts.append(f"exact SBD k={k_exact} γ={g:g} {wall['exact']:.2f} s "
                 f"({wall['ntp'] / wall['exact']:.2f}x)")
    print(f"\nwall clock, first {len(problems)} test problems one at a time (batch 1, KV cache "
          "all): " + ", ".join(parts))
    return wall


def step_views(sbd_model, task, base, calibration, k, k_exact):
    """One test problem step by step at k's γ_low (plain; k None: none), and a problem where the
    exact mode at k_exact rejected a draft."""
    device = next(sbd_model.parameters()).device
    views = [base.replace(k=k, gamma=calibration[k]["low"])] if k is not None else []
    views.append(base.replace(k=k_exact, gamma=calibration[k_exact]["exact"], exact=True))
    for settings in views:
        for prompt, _ in task.splits["test"][:50]:
            ids = torch.tensor([task.encode_prompt(prompt)], device=device)
            n = new_tokens(task, sbd_model, ids.size(1))
            _, stats = decode(sbd_model, ids, settings, n, record_steps=True)
            if not settings.exact or stats.rejected[0]:  # show where exact had something to correct
                break
        legend = (", ~x~ = rejected drafts, {y} = NTP's token in their place" if settings.exact
                  else "")
        print(f"\none test problem, {mode_name(settings)} k={settings.k} "
              f"γ={settings.gamma:g}, step by step "
              f"([x] = revealed by that forward, _ = masked{legend}):")
        print(format_steps(stats.steps, task.decode, task.mask_id, prompt=prompt))


TAIL = (0.1, 1.0, 1e9)  # the picture goes on past the choice, up to revealing everything at once
CURVE_GRID = (1e-3, 0.01, 0.1, 1.0, 1e9)  # a block size that is only drawn


def curves(model, task, base, calibration, extra_ks, n, batch_size, exact_batch_size):
    """{k: dict(points=[(γ, val accuracy, tokens per forward)], exact=tokens per forward, low,
    high)} for the picture: each calibrated k's sweep continued past where the choice stopped (on
    the first n val problems), and the extra block sizes swept coarsely on the same problems."""
    val = task.splits["val"][:n]

    def point(k, g):
        r = solve(model, task, val, base.replace(k=k, gamma=g), batch_size=batch_size)
        print(f"  picture   k={k:2d} γ={g:<7g} val accuracy {r['accuracy']:6.2f}%  "
              f"{tokens_per_forward(r):5.2f} tokens/forward ({len(val)} val problems)")
        return g, r["accuracy"], tokens_per_forward(r)

    out = {}
    for k, c in calibration.items():
        tail = [point(k, g) for g in TAIL if g > c["sweep"][-1][0]]
        out[k] = dict(points=c["sweep"] + tail, exact=max(t for _, t in c["exact_sweep"]),
                      low=c["low"], high=c["high"])
    for k in extra_ks:
        exact = solve(model, task, val, base.replace(k=k, gamma=1e9, exact=True),
                      batch_size=exact_batch_size)
        out[k] = dict(points=[point(k, g) for g in CURVE_GRID], exact=tokens_per_forward(exact),
                      low=None, high=None)
    return out


def plot_sweep(curves, ntp_val_accuracy, low_target, path, trained_k=None):
    """Val accuracy against tokens per forward, one curve per k from the smallest γ to revealing
    every masked position at once; γ_low/γ_high and the exact mode (a star at NTP's accuracy)
    marked. matplotlib is optional: without it, say how to get the picture and go on."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no screen needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib to get this sweep as a picture)")
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for k, c in curves.items():
        gammas, accs, tpfs = zip(*c["points"])
        lossless = min(accs) >= ntp_val_accuracy - low_target
        label = f"SBD k={k}" + (" (no γ loses accuracy)" if lossless else "")
        if trained_k is not None and k > trained_k:
            label += f", a block size never trained (k <= {trained_k})"
        line, = ax.plot(tpfs, accs, "o-", label=label)
        ax.annotate("all at once", (tpfs[-1], accs[-1]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7, color=line.get_color())
        for name, marker in (("low", "v"), ("high", "^")):
            g = c[name]
            if g is not None:
                i = gammas.index(g)
                ax.plot(tpfs[i], accs[i], marker, color=line.get_color(), markersize=12,
                        markerfacecolor="none")
                both = c["low"] == c["high"]  # one γ that is both gets one label
                if name == "high" or not both:
                    text = "γ_low=γ_high" if both else f"γ_{name}"
                    ax.annotate(f"{text}={g:g}", (tpfs[i], accs[i]), textcoords="offset points",
                                xytext=(6, -12), fontsize=8)
        ax.plot(c["exact"], ntp_val_accuracy, "*", color=line.get_color(), markersize=14,
                label=f"exact SBD k={k}")
    ax.axhline(ntp_val_accuracy, color="gray", linestyle="--", label="NTP (1 token/forward)")
    # at least 2 points of scale below NTP: on a nearly perfect model one val problem (0.05 points)
    # would otherwise fill the whole height and look like a cliff
    accuracies = [a for c in curves.values() for _, a, _ in c["points"]] + [ntp_val_accuracy]
    ax.set_ylim(min(min(accuracies), ntp_val_accuracy - 2) - 0.5, max(accuracies) + 0.5)
    ax.set_xlabel("tokens per forward (= NFE speed-up over NTP)")
    ax.set_ylabel("val accuracy (%)")
    ax.set_title("SBD: accuracy against forwards saved, one point per γ")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def load_small_run(out_dir, device):
    """The small demo: (NTP baseline ckpt_ntp.pt, SBD model ckpt_sbd.pt, its checkpoint, task)."""
    ntp_model, _ = load_checkpoint(f"{out_dir}/ckpt_ntp.pt", device)
    sbd_model, checkpoint = load_checkpoint(f"{out_dir}/ckpt_sbd.pt", device)
    return (ntp_model, sbd_model, checkpoint,
            task_of_checkpoint(checkpoint, f"{out_dir}/ckpt_sbd.pt"))


# evaluate.py's settings (python evaluate.py --key=value); 0 and () take the task kind's DEFAULTS
OPTIONS = dict(
    out_dir="out-sbd-small",  # the run to evaluate: train.py's out_dir
    device="",  # '' = the best there is: cuda -> mps -> cpu
    ks=(8, 16),  # the block sizes calibrated and reported
    picture_ks=(32,),  # block sizes only drawn in sweep.png
    picture_problems=500,  # val problems of the picture's points past the calibration
    max_problems=0,  # only the first max_problems of each split (0 = all)
    low_target=0.5,  # γ_low: the largest γ that loses at most this many points of val accuracy
    high_target=1.5,  # γ_high: the same with this many
    gamma_grid=(),  # the γ values swept on val, upward
    batch_size=0,  # prompts decoded together (NTP and plain SBD)
    exact_batch_size=0,  # prompts decoded together by the exact mode (0 = batch_size)
    exact_val_problems=0,  # val problems that pick the exact mode's γ
    exact_gammas=(),  # the γ values they try; () = EXACT_GRID
    timing_problems=0,  # test problems decoded one at a time for the wall-clock comparison
    # a chat model (train.py with a pretrained init_from) on a JSONL benchmark (pretrained.py)
    benchmark="",  # test rows {"prompt": ..., "answer": ...}; '' = the small demo of out_dir
    val_benchmark="",  # γ is calibrated on val_problems rows of this file ('' = of benchmark)
    val_problems=200,  # (without val_benchmark, at most half the benchmark; the rest is test)
    baseline="",  # the NTP baseline: a directory, .gguf or .pt; '' = the run's own (pretrained.py)
    answer_marker="",  # grade the number after the last '####' or in the last '\boxed{...}'
    numeric=True,  # answers are numbers compared by value ('1,234' == '1234'); False: text
    max_new_tokens=512,  # the longest completion (cut per prompt to the model's context)
    dtype="float32",  # decoding: 'float32', 'bfloat16', or 'auto' (bf16 where the device has it)
    fp32_check_problems=0,  # decoding in bf16: decode this many test problems in fp32 as well,
    # where exact SBD must give the NTP decoding's output, token for token
)


def report(out_dir, device="cpu", run=None, reference=None, fp32_models=None, **options):
    """Calibrate γ on val, evaluate on test, print the table, write out_dir/calibration.json and
    the whole report to out_dir/report.json. run: (NTP baseline, SBD model, its checkpoint, task)
    already loaded (pretrained.load_run); None: the small demo in out_dir. reference: (name,
    model), a row for the model the run started from. fp32_models: (NTP baseline, SBD model) in
    fp32, for the identity check of a bf16 report. options: OPTIONS' keys."""
    o = {**OPTIONS, **options}
    ntp_model, sbd_model, checkpoint, task = run or load_small_run(out_dir, device)
    defaults = DEFAULTS["small" if isinstance(task, CharTask) else "benchmark"]
    grid, batch_size = (o["gamma_grid"] or defaults["grid"],
                        o["batch_size"] or defaults["batch_size"])
    exact_val_problems = o["exact_val_problems"] or defaults["exact_val_problems"]
    timing_problems = o["timing_problems"] or defaults["timing_problems"]
    exact_batch_size = o["exact_batch_size"] or batch_size
    low_target, high_target = o["low_target"], o["high_target"]
    n = o["max_problems"] or None
    task.splits = {split: problems[:n] for split, problems in task.splits.items()}
    skipped = skip_long_prompts(task, min(ntp_model.max_seq_len, sbd_model.max_seq_len))
    t0 = time.time()
    base = settings_for(checkpoint, gamma=0.0)  # mask and stop tokens, the first-token rule
    if not base.first_from_ntp:
        print("this SBD model was trained without the NTP term (ntp_weight=0): SBD reveals each "
              "block's first slot by the rule (the paper's Algorithm 3), and the exact mode, which "
              "checks with the untrained next-token head, reproduces its NTP decoding")
    # the budgets count from the better NTP decoding on val: the baseline's, or the SBD model's
    # own (which kept training its NTP term), so that a weak baseline never lets a lossy γ through
    ntp_vals = [solve(m, task, task.splits["val"], base, ntp=True,
                      batch_size=batch_size)["accuracy"]
                for m in (ntp_model, sbd_model)]
    ntp_val = max(ntp_vals)
    print(f"calibrating γ on {len(task.splits['val'])} val problems (NTP decoding: baseline "
          f"{ntp_vals[0]:.2f}%, SBD model {ntp_vals[1]:.2f}%): γ_low within {low_target} points, "
          f"γ_high within {high_target}; γ grid {list(grid)}")
    calibration = {k: calibrate(sbd_model, task, base, ntp_val, k, low_target, high_target, grid,
                                batch_size, exact_val_problems, exact_batch_size,
                                o["exact_gammas"] or EXACT_GRID)
                   for k in o["ks"]}
    rows = table_rows(ntp_model, sbd_model, task, base, calibration,
                      dict(low=low_target, high=high_target), batch_size, exact_batch_size)
    if reference is not None:  # the model the run started from, before any fine-tuning
        name, model = reference
        result = solve(model, task, task.splits["test"], base, ntp=True, batch_size=batch_size)
        rows.insert(1, (f"{name} as loaded, NTP decoding", result))
    print_table(rows, task)
    checks = {}
    if fp32_models is not None:
        checks["fp32"] = fp32_identity(*fp32_models, task, base, calibration,
                                       o["fp32_check_problems"], batch_size, exact_batch_size)

    best_k = operating_point(calibration)
    if best_k is None:
        print(f"\nno k has a γ within {low_target} points of NTP on val: decode with the exact "
              "mode (sample.py --exact=True) or pass a γ")
    exact_k = exact_operating_point(calibration)
    wall = wall_clock(ntp_model, sbd_model, task, base, calibration, best_k, exact_k,
                      timing_problems)
    step_views(sbd_model, task, base, calibration, best_k, exact_k)
    drawn = curves(sbd_model, task, base, calibration, o["picture_ks"], o["picture_problems"],
                   batch_size, exact_batch_size)
    trained_k = (checkpoint.get("config") or {}).get("k_max")
    picture = plot_sweep(drawn, ntp_val, low_target, os.path.join(out_dir, "sweep.png"), trained_k)

    calibrated_on = getattr(task, "info", {}).get("val", f"the val split of {task.name}")
    choices = dict(k={str(k): dict(gamma_low=c["low"], gamma_high=c["high"], gamma_exact=c["exact"])
                      for k, c in calibration.items()},
                   operating_k=best_k, exact_k=exact_k, calibrated_on=calibrated_on)
    write_calibration(os.path.join(out_dir, "ckpt_sbd.pt"), checkpoint, choices)
    baseline = rows[0][1]
    summary = dict(
        val_problems=len(task.splits["val"]), test_problems=len(task.splits["test"]),
        ntp_val_accuracy=ntp_val, budgets=dict(low=low_target, high=high_target),
        calibration={str(k): c for k, c in calibration.items()}, operating_k=best_k,
        curves={str(k): c for k, c in drawn.items()},
        exact_k=exact_k,
        rows=[dict(name=name, key=row_key(name), **({} if r is None else dict(
            accuracy=r["accuracy"], delta=r["accuracy"] - baseline["accuracy"],
            forwards=r["forwards"], tokens=r["tokens"],
            speedup=baseline["forwards"] / r["forwards"],
            **({"same_as_ntp": r["same_as_ntp"]} if "same_as_ntp" in r else {}))))
              for name, r in rows],
        task=dict(name=task.name, skipped=skipped, **getattr(task, "info", {})),
        gamma_grid=list(grid), wall_clock=wall, checks=checks,
        machine=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
        dtype=str(next(sbd_model.parameters()).dtype).removeprefix("torch."),
        device=torch.cuda.get_device_name() if str(device).startswith("cuda") else str(device),
        seconds=time.time() - t0, config=checkpoint.get("config"))
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nwrote the γ choices to {out_dir}/calibration.json, the report to "
          f"{out_dir}/report.json" + (f", the sweep to {picture}" if picture else "")
          + f" ({time.time() - t0:.0f} s for the report)")
    return rows, calibration, wall


def fp32_identity(ntp_model, sbd_model, task, base, calibration, n, batch_size, exact_batch_size):
    """The exact mode's promise where rounding cannot break ties differently: on the first n test
    problems, in fp32, exact SBD's completions must equal the SBD model's NTP decoding."""
    problems = task.splits["test"][:n]
    ntp = solve(sbd_model, task, problems, base, ntp=True, batch_size=batch_size)["completions"]
    result = {}
    for k, c in calibration.items():
        settings = base.replace(k=k, gamma=c["exact"], exact=True)
        out = solve(sbd_model, task, problems, settings, batch_size=exact_batch_size)["completions"]
        result[str(k)] = same = sum(a == b for a, b in zip(out, ntp))
        print(f"fp32 check, exact SBD k={k}: completions identical to NTP decoding on {same} of "
              f"{len(problems)} test problems")
    return dict(problems=len(problems), identical=result)


def main(argv):
    """python evaluate.py [--key=value ...]: OPTIONS' keys."""
    o = dict(OPTIONS)
    configure(o, argv)
    device = pick_device(o.pop("device"))
    out_dir, benchmark = o["out_dir"], o["benchmark"]
    run = reference = fp32_models = None
    if benchmark:
        run = load_run(out_dir, device, benchmark, o["val_benchmark"], o["baseline"],
                       o["dtype"], val_problems=o["val_problems"],
                       max_new_tokens=o["max_new_tokens"], answer_marker=o["answer_marker"],
                       numeric=o["numeric"])
        reference = load_reference(run[2], device, next(run[1].parameters()).dtype, o["baseline"])
        if o["fp32_check_problems"] and next(run[1].parameters()).dtype != torch.float32:
            fp32_models = load_models(out_dir, device, o["baseline"], "float32")[:2]
    report(out_dir, device, run=run, reference=reference, fp32_models=fp32_models,
           **{k: v for k, v in o.items() if k not in ("out_dir",)})


def load_reference(checkpoint, device, dtype, baseline):
    """(name, model) of the pretrained model a run started from, when it is not the baseline."""
    init_from = (checkpoint.get("config") or {}).get("init_from", "")
    if init_from in ("", "scratch", "resume") or init_from == baseline:
        return None
    model = load_baseline(init_from, device, dtype)
    return os.path.basename(pretrained_path(init_from).rstrip("/")).removesuffix(".gguf"), model


if __name__ == "__main__":
    main(sys.argv[1:])
