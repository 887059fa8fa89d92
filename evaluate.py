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
   by construction): its γ is the one with the most tokens per forward on val (of a tie, the
   largest: fastest per forward). The choices go to out_dir/calibration.json (sampling.py), the
   whole report to out_dir/report.json. A model trained on blocks masked whole only gets the exact
   mode alone (--plain).
2. On the test split: NTP accuracy of the NTP baseline and of the SBD model itself; SBD at γ_low
   and γ_high and exact SBD for each k (exact completions must equal the SBD model's NTP
   decoding: checked); wall clock of NTP, SBD and exact SBD decoding one problem at a time.
3. One test problem step by step, plain and exact; the γ sweep as a picture (out_dir/sweep.png,
   with matplotlib installed).
NFE speed-up = (forwards NTP decoding needed for the test set) / (forwards SBD decoding needed),
every row decoded until its own stop token. Prompts of different lengths are decoded together,
left-padded (tasks/solve.py); every problem gets the same token budget in every mode.
"""

import itertools
import os
import sys
import time

import torch

from checkpoint import load_checkpoint, settings_for, write_calibration, write_json
from configurator import configure, pick_device, require
from pretrained.loading import (
    four_bit_blocks,
    load_baseline,
    load_models,
    load_run,
    pretrained_path,
)
from report.summary import machine, print_paired, summary_rows
from report.sweep import curves, plot_sweep
from report.views import exact_name, exact_settings, fp32_identity, step_views, wall_clock
from sampling import ONE_FORWARD
from sbd import is_adapter
from serving.layout import WEIGHTS, fastest_setup, lay_out_for_decoding
from tasks import CharTask, task_of_checkpoint
from tasks.solve import skip_long_prompts, solve, tokens_per_forward

# below 3e-4: ~1 token/forward. Half a decade apart: a step that gains less than SATURATED ends
# the sweep, and low γ, which reveal few tokens per forward, are the slowest to decode
GAMMA_GRID = [3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0]
SATURATED = 1.02  # the sweep stops once a larger γ gains less than 2% tokens per forward
# a real model is far less over-confident: around the paper's γ (reasoning 0.1 / 0.35, chat 0.35 /
# 0.6; docs/method.md, The paper's results)
LLAMA_GAMMA_GRID = [0.05, 0.1, 0.2, 0.35, 0.5, 0.6, 0.8, 1.0]
EXACT_GRID = [0.01, 0.1, 1.0, ONE_FORWARD]  # the last: every masked token at once
# settings left unset: the demo decodes a problem in milliseconds on a CPU, a Llama on a benchmark
# in seconds on a GPU, so there the batch-1 parts (the exact mode's γ, the wall clock) use fewer
# problems. The demo calibrates γ on 1000 of its 2000 val problems: half a point is 5 of them
DEFAULTS = dict(small=dict(grid=GAMMA_GRID, batch_size=250, val_problems=1000,
                           exact_val_problems=200, timing_problems=200),
                benchmark=dict(grid=LLAMA_GAMMA_GRID, batch_size=64, val_problems=200,
                               exact_val_problems=50, timing_problems=20))
def within_budget(sweep, floor):
    """The largest γ of an upward sweep [(γ, result)] such that every γ up to it keeps val accuracy
    >= floor, if it decodes with fewer forwards than NTP (tokens per forward > 1); else None."""
    passed = []
    for g, r in sweep:
        if r["accuracy"] < floor:
            break
        passed.append((g, r))
    return passed[-1][0] if passed and tokens_per_forward(passed[-1][1]) > 1 else None


def fastest_exact(sweep):
    """The exact mode's (γ, draft floor) of a sweep [(γ, floor, result)]: the fewest forwards; of
    a tie the largest γ, which runs the reveal rule least (at ONE_FORWARD not at all: every slot in
    one forward), then the lowest floor (the setting without a cut)."""
    g, floor, _ = max(sweep, key=lambda s: (tokens_per_forward(s[2]), s[0], -s[1]))
    return g, floor


def calibrate(model, task, base, ntp_val_accuracy, k, low_target, high_target, grid=GAMMA_GRID,
              batch_size=250, exact_val_problems=200, exact_batch_size=1, exact_grid=EXACT_GRID,
              draft_floors=(0.0,)):
    """-> dict(low=γ or None, high=γ or None, exact=γ, exact_floor=min_draft_prob, sweep=[(γ,
    val acc, tok/fwd)], exact_sweep=[(γ, floor, tok/fwd)]). base: the DecodeSettings every γ of
    the sweep starts from. The exact mode tries every γ of exact_grid with every draft floor."""
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
    for g, floor in itertools.product(exact_grid, draft_floors):
        settings = base.replace(k=k, gamma=g, exact=True, min_draft_prob=floor)
        r = solve(model, task, val[:exact_val_problems], settings, batch_size=exact_batch_size)
        exact_sweep.append((g, floor, r))
        print(f"  calibrate exact k={k:2d} γ={g:<7g} min_draft_prob={floor:<4g} "
              f"{tokens_per_forward(r):5.2f} tokens/forward ({r['rejected']} drafts rejected on "
              f"{min(len(val), exact_val_problems)} val problems)")
    g, floor = fastest_exact(exact_sweep)
    return dict(low=within_budget(sweep, ntp_val_accuracy - low_target),
                high=within_budget(sweep, ntp_val_accuracy - high_target),
                exact=g, exact_floor=floor,
                sweep=[(g, r["accuracy"], tokens_per_forward(r)) for g, r in sweep],
                exact_sweep=[(g, f, tokens_per_forward(r)) for g, f, r in exact_sweep])


def table_rows(ntp_model, sbd_model, task, base, calibration, budgets, batch_size=250,
               exact_batch_size=1, shared=False, reference=None):
    """Table 1 on test -> [(name, result)]; a budget no γ met is a row with result None.
    An exact row's result also counts the problems whose completion equals the SBD model's NTP
    decoding. shared: the SBD model's next-token path is the baseline (shares_next_token_path),
    so its NTP decoding is the baseline's, not decoded twice. reference: (name, model), a row for
    the model the run started from, before any fine-tuning."""
    test = task.splits["test"]
    baseline = solve(ntp_model, task, test, base, ntp=True, batch_size=batch_size)
    sbd_ntp = baseline if shared else solve(sbd_model, task, test, base, ntp=True,
                                            batch_size=batch_size)
    rows = [("NTP baseline", baseline), ("SBD model, NTP decoding", sbd_ntp)]
    if reference is not None:
        name, model = reference
        rows.insert(1, (f"{name} as loaded, NTP decoding",
                        solve(model, task, test, base, ntp=True, batch_size=batch_size)))
    for k, chosen in calibration.items():
        decoded = {}  # γ -> result: γ_low and γ_high are often one γ, decoded once
        for name in ("low", "high") if chosen["sweep"] else ():  # no sweep: plain left out
            g = chosen[name]
            if g is not None and g not in decoded:
                decoded[g] = solve(sbd_model, task, test, base.replace(k=k, gamma=g),
                                   batch_size=batch_size)
            rows.append((f"SBD k={k} γ_{name}={g:g}" if g is not None else
                         f"SBD k={k} γ_{name}: no γ within {budgets[name]} points on val",
                         decoded.get(g)))
        exact = solve(sbd_model, task, test, exact_settings(base, k, chosen),
                      batch_size=exact_batch_size)
        same = sum(a == b for a, b in zip(exact["completions"], sbd_ntp["completions"]))
        exact["same_as_ntp"] = same
        # the point of the exact mode: never let a difference pass unnoticed. In fp32 a batch row
        # and a lone row round alike, so a difference is a bug; in bf16 the batched NTP decoding
        # may break a near-tie the other way: print_table counts those under the table
        if same != len(test) and next(sbd_model.parameters()).dtype == torch.float32:
            raise RuntimeError(f"exact SBD k={k} differs from the SBD model's NTP decoding on "
                               f"{len(test) - same} of {len(test)} test problems")
        rows.append((f"SBD exact k={k} {exact_name(chosen)}", exact))
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


def operating_point(calibration):
    """The k whose γ_low decodes with the fewest forwards on val, or None if no k has one."""
    speed = {k: dict((g, tpf) for g, _, tpf in c["sweep"])[c["low"]]
             for k, c in calibration.items() if c["low"] is not None}
    return max(speed, key=speed.get) if speed else None


def operating_points(calibration, low_target):
    """-> (operating_point, exact_operating_point); without the first (where plain SBD was
    calibrated), says how to decode."""
    best_k = operating_point(calibration)
    if best_k is None and any(c["sweep"] for c in calibration.values()):
        print(f"\nno k has a γ within {low_target} points of NTP on val: decode with the exact "
              "mode (sample.py --exact=True) or pass a γ")
    return best_k, exact_operating_point(calibration)


def exact_operating_point(calibration):
    """The k whose exact mode decodes with the fewest forwards on val."""
    return max(calibration, key=lambda k: max(s[-1] for s in calibration[k]["exact_sweep"]))


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
    plain=None,  # plain SBD's rows (γ calibrated on val); None: unless the model was trained on
    # blocks masked whole only (all_masked_rows=1), which plain SBD's partly revealed blocks never
    # match (docs/findings.md, "Blocks masked whole"): its rows would cost minutes to read ~0%
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
    draft_floors=(0.0,),  # and the min_draft_prob values, with each γ (0: check every draft)
    timing_problems=0,  # test problems decoded one at a time for the wall-clock comparison
    # a chat model (train.py, pretrained init_from) on a JSONL benchmark (pretrained/loading.py)
    benchmark="",  # test rows {"prompt": ..., "answer": ...}; '' = the small demo of out_dir
    val_benchmark="",  # γ is calibrated on val_problems rows of this file ('' = of benchmark)
    val_problems=0,  # the val problems γ is calibrated on (0: DEFAULTS); a benchmark without
    # val_benchmark gives at most half of it to val, the rest is test
    baseline="",  # the NTP baseline: a directory, .gguf or .pt; '' = the run's own (load_run)
    as_loaded=True,  # a row for the pretrained model the run started from, decoded as loaded
    answer_marker="",  # grade the number after the last '####' or in the last '\boxed{...}'
    numeric=True,  # answers are numbers compared by value ('1,234' == '1234'); False: text
    max_new_tokens=512,  # the longest completion (cut per prompt to the model's context)
    dtype="float32",  # decoding: 'float32', 'bfloat16', or 'auto' (bf16 where the device has it)
    fp32_check_problems=0,  # decoding in bf16: decode this many test problems in fp32 as well,
    # where exact SBD must give the NTP decoding's output, token for token
    compile=None,  # True: every forward through torch.compile's graphs; None: auto (10M+ params)
    weights="auto",  # 'trained', 'int8', 'int4' (a GGUF file's 4-bit blocks); 'auto': int4 if any
    quantized_rows=1,  # int8/int4 kernels for forwards of up to this many rows (wider: dense)
)


def report(out_dir, device="cpu", run=None, reference=None, fp32_models=None, **options):
    """Calibrate γ on val, evaluate on test, print the table, write out_dir/calibration.json and
    the whole report to out_dir/report.json. run: (NTP baseline, SBD model, its checkpoint, task)
    already loaded (pretrained.load_run); None: the small demo in out_dir. reference: (name,
    model), a row for the model the run started from. fp32_models: (NTP baseline, SBD model) in
    fp32, for the identity check of a bf16 report. options: OPTIONS' keys."""
    ntp_model, sbd_model, checkpoint, task = run or load_small_run(out_dir, device)
    o, n = resolve_options(task, options), options.get("max_problems") or None
    task.splits = {split: problems[:n] for split, problems in task.splits.items()}
    task.splits["val"] = task.splits["val"][:o["val_problems"]]
    skipped = skip_long_prompts(task, min(ntp_model.max_seq_len, sbd_model.max_seq_len))
    t0 = time.time()
    shared = shares_next_token_path(ntp_model, sbd_model)
    phases = {}  # where the report's time goes, in seconds since t0
    lap = lambda name: phases.setdefault(name, round(time.time() - t0))
    o["grid"] = o["grid"] if decodes_plain(checkpoint, o["plain"]) else ()
    batched, batch_1 = fast_decoding([ntp_model, sbd_model, *(reference or [None])[1:]],
                                     checkpoint, o)  # whether each decodes compiled
    base = settings_for(checkpoint, gamma=0.0, compiled=batched)  # mask, stop, first-token rule
    explain_ntp_decoding(base, shared)
    ntp_val, calibration = calibrate_all(ntp_model, sbd_model, task, base, o, shared)
    lap("calibrated on val")
    budgets = dict(low=o["low_target"], high=o["high_target"])
    rows = table_rows(ntp_model, sbd_model, task, base, calibration, budgets, o["batch_size"],
                      o["exact_batch_size"], shared, reference)
    print_table(rows, task)
    print_paired(rows)
    lap("Table 1 decoded")
    checks = {}
    if fp32_models is not None:
        checks["fp32"] = fp32_identity(*fp32_models, task, base, calibration,
                                       o["fp32_check_problems"], o["batch_size"],
                                       o["exact_batch_size"])
        lap("fp32 check")
    best_k, exact_k = operating_points(calibration, o["low_target"])
    wall = wall_clock(ntp_model, sbd_model, task, base.replace(compiled=batch_1), calibration,
                      best_k, exact_k, o["timing_problems"])
    lap("wall clock")
    step_views(sbd_model, task, base, calibration, best_k, exact_k)
    drawn, picture = {}, None
    if o["grid"]:
        drawn, picture = draw_sweep(sbd_model, task, base, calibration, ntp_val, o, out_dir,
                                    (checkpoint.get("config") or {}).get("k_max"))
    lap("step views and the sweep's picture")
    write_calibration(os.path.join(out_dir, "ckpt_sbd.pt"), checkpoint,
                      choices(calibration, best_k, exact_k, task))
    summary = dict(val_problems=len(task.splits["val"]), test_problems=len(task.splits["test"]),
                   ntp_val_accuracy=ntp_val, budgets=budgets, operating_k=best_k, exact_k=exact_k,
                   calibration={str(k): c for k, c in calibration.items()},
                   curves={str(k): c for k, c in drawn.items()}, rows=summary_rows(rows),
                   task=dict(name=task.name, skipped=skipped, **getattr(task, "info", {})),
                   gamma_grid=list(o["grid"]), wall_clock=wall, checks=checks,
                   **machine(sbd_model, device), seconds=time.time() - t0, phases=phases,
                   config=checkpoint.get("config"))
    write_json(os.path.join(out_dir, "report.json"), summary)
    print(f"\nwrote the γ choices to {out_dir}/calibration.json, the report to "
          f"{out_dir}/report.json" + (f", the sweep to {picture}" if picture else "")
          + f" ({time.time() - t0:.0f} s for the report; seconds since its start: "
          + ", ".join(f"{name} {s}" for name, s in phases.items()) + ")")
    return rows, calibration, wall


def choices(calibration, best_k, exact_k, task):
    """What calibration.json keeps of a calibration (checkpoint.settings_for reads it)."""
    calibrated_on = getattr(task, "info", {}).get("val", f"the val split of {task.name}")
    return dict(k={str(k): dict(gamma_low=c["low"], gamma_high=c["high"], gamma_exact=c["exact"],
                                min_draft_prob=c["exact_floor"])
                   for k, c in calibration.items()},
                operating_k=best_k, exact_k=exact_k, calibrated_on=calibrated_on)


def fast_decoding(models, checkpoint, o):
    """Lay every model's weights out for decoding as o's compile, weights and quantized_rows say
    ('auto': serving.layout.fastest_setup) -> (whether batches decode compiled, whether the
    batch-1 wall clock does)."""
    four_bit = four_bit_blocks(checkpoint)
    # 'auto' never quantizes a fine-tune again (sample.py says why): trained weights
    compile, weights = fastest_setup(models[-1], o["compile"], o["weights"], False)
    for model in models:
        lay_out_for_decoding(model, next(model.parameters()).dtype, weights, o["quantized_rows"],
                             four_bit)
    # on a CPU a batch of 32 is compute-bound: eager decodes it as fast as the compiled graphs,
    # which would compile again for every batch shape (docs/findings.md, "The report's batches")
    batches = compile and next(models[0].parameters()).device.type != "cpu"
    print(f"decoding: {weights} weights, batches " + ("compiled" if batches else "eager")
          + ", batch 1 " + ("compiled" if compile else "eager"))
    return batches, compile


def draw_sweep(model, task, base, calibration, ntp_val, o, out_dir, trained_k):
    """The γ sweep continued past the choice, drawn to out_dir/sweep.png -> (curves, path)."""
    drawn = curves(model, task, base, calibration, o["picture_ks"], o["picture_problems"],
                   o["batch_size"], o["exact_batch_size"])
    path = os.path.join(out_dir, "sweep.png")
    return drawn, plot_sweep(drawn, ntp_val, o["low_target"], path, trained_k)


def resolve_options(task, options):
    """OPTIONS with the caller's values, unset ones (0, ()) from the task kind's DEFAULTS; a value
    out of range is a one-line error."""
    o = check_options({**OPTIONS, **options})
    defaults = DEFAULTS["small" if isinstance(task, CharTask) else "benchmark"]
    o["grid"] = o["gamma_grid"] or defaults["grid"]
    for key in ("batch_size", "val_problems", "exact_val_problems", "timing_problems"):
        o[key] = o[key] or defaults[key]
    o["exact_batch_size"] = o["exact_batch_size"] or o["batch_size"]
    return o


def check_options(o):
    """A setting out of its range is a one-line error, before anything loads. -> o"""
    for key in ("batch_size", "exact_batch_size", "val_problems", "exact_val_problems",
                "timing_problems", "max_problems"):
        require(o[key] >= 0, f"{key} must be >= 1, or 0 for the default; got {o[key]}")
    for key in ("picture_problems", "max_new_tokens"):
        require(o[key] >= 1, f"{key} must be >= 1, got {o[key]}")
    require(0 <= o["low_target"] <= o["high_target"],
            f"need 0 <= low_target <= high_target, got {o['low_target']}, {o['high_target']}")
    for key in ("ks", "picture_ks"):
        require(all(k >= 1 for k in o[key]), f"{key}: block sizes must be >= 1, got {o[key]}")
    require(o["ks"], "ks: name at least one block size, e.g. --ks=(8,16)")
    require(o["plain"] in (True, False, None), f"plain must be True, False or None: {o['plain']!r}")
    require(o["compile"] in (True, False, None), f"compile must be True or False: {o['compile']!r}")
    require(o["weights"] in (*WEIGHTS, "auto"),
            f"weights must be one of {WEIGHTS} or 'auto', got {o['weights']!r}")
    require(o["quantized_rows"] >= 1, f"quantized_rows must be >= 1, got {o['quantized_rows']}")
    for key in ("gamma_grid", "exact_gammas"):
        require(all(g >= 0 for g in o[key]), f"{key}: γ values must be >= 0, got {o[key]}")
    require(o["draft_floors"] and all(0 <= f <= 1 for f in o["draft_floors"]),
            f"draft_floors: probabilities in [0, 1], e.g. (0,0.5); got {o['draft_floors']}")
    return o


def decodes_plain(checkpoint, plain):
    """Whether the report decodes plain SBD (plain: the option; None: unless the model never saw
    a partly revealed block in training), saying so when it does not."""
    config = checkpoint.get("config") or {}
    if plain is None:
        plain = config.get("all_masked_rows", 0.0) < 1
        if not plain:
            print("plain SBD left out: this model was trained on blocks masked whole "
                  "(all_masked_rows=1), and plain SBD reveals into partly masked blocks, which it "
                  "never saw (docs/findings.md, 'Blocks masked whole'); --plain=True decodes it")
    return plain


def shares_next_token_path(ntp_model, sbd_model):
    """Whether the SBD model is a block adapter over the baseline's own weights: then its causal
    logits are the baseline's (tests/test_adapter.py checks them bit for bit in fp32), and its NTP
    decoding need not be decoded a second time."""
    if getattr(sbd_model, "block_adapter", None) is None:
        return False
    base = {name: t for name, t in sbd_model.state_dict().items() if not is_adapter(name)}
    own = ntp_model.state_dict()
    return base.keys() == own.keys() and all(torch.equal(t, own[name]) for name, t in base.items())


def explain_ntp_decoding(base, shared):
    """Say where the SBD model's NTP decoding and its blocks' first tokens come from."""
    if shared:
        print("the SBD model is a block adapter over the NTP baseline's weights: its NTP decoding "
              "is the baseline's (the same next-token path), decoded once")
    if not base.first_from_ntp:
        print("this SBD model was trained without the NTP term (ntp_weight=0): SBD reveals each "
              "block's first slot by the rule (the paper's Algorithm 3), and the exact mode, which "
              "checks with the untrained next-token head, reproduces its NTP decoding")


def calibrate_all(ntp_model, sbd_model, task, base, o, shared=False):
    """-> (NTP val accuracy the budgets count from, {k: calibrate()'s record}).

    The budgets count from the better NTP decoding on val: the baseline's, or the SBD model's own
    (which kept training its NTP term), so that a weak baseline never lets a lossy γ through."""
    val_accuracy = lambda m: solve(m, task, task.splits["val"], base, ntp=True,
                                   batch_size=o["batch_size"])["accuracy"]
    baseline = val_accuracy(ntp_model)
    ntp_vals = [baseline, baseline if shared else val_accuracy(sbd_model)]
    ntp_val = max(ntp_vals)
    targets = (f"γ_low within {o['low_target']} points, γ_high within {o['high_target']}; γ grid "
               f"{list(o['grid'])}" if o["grid"] else "the exact mode only")
    print(f"calibrating on {len(task.splits['val'])} val problems (NTP decoding: baseline "
          f"{ntp_vals[0]:.2f}%, SBD model {ntp_vals[1]:.2f}%): {targets}")
    calibration = {k: calibrate(sbd_model, task, base, ntp_val, k, o["low_target"],
                                o["high_target"], o["grid"], o["batch_size"],
                                o["exact_val_problems"], o["exact_batch_size"],
                                o["exact_gammas"] or EXACT_GRID, o["draft_floors"])
                   for k in o["ks"]}
    return ntp_val, calibration


def main(argv):
    """python evaluate.py [--key=value ...]: OPTIONS' keys."""
    o = dict(OPTIONS)
    configure(o, argv)
    check_options(o)
    device = pick_device(o.pop("device"))
    out_dir, benchmark = o["out_dir"], o["benchmark"]
    run = reference = fp32_models = None
    if benchmark:
        run = load_run(out_dir, device, benchmark, o["val_benchmark"], o["baseline"],
                       o["dtype"],
                       val_problems=o["val_problems"] or DEFAULTS["benchmark"]["val_problems"],
                       max_new_tokens=o["max_new_tokens"], answer_marker=o["answer_marker"],
                       numeric=o["numeric"])
        if o["as_loaded"]:
            reference = load_reference(run[2], device, next(run[1].parameters()).dtype,
                                       o["baseline"])
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
