"""
The paper's Table 1 for a model with verifiable answers: accuracy and NFE speed-up of SBD against NTP.

    python evaluate.py --out_dir=out-sbd-small        (train.py runs this at the end of the main job)

1. Calibrate γ on the val split (never test), for each block size k. Tiny models are over-confident, so the
   paper's γ values are far too high for them (FINDINGS.md); γ is swept over a grid instead, upward.
   γ_low is the largest γ such that no γ up to it loses more than low_target points of val accuracy against
   the NTP model (γ_high: high_target points). "No γ up to it", not "this γ": the sweep is noisy and not
   monotone, and a γ that passes by luck just past one that fails would not pass on test. A budget that no
   γ meets with fewer forwards than NTP gets no row, and the report says so.
   The exact mode (verify=True) needs no budget, its accuracy is NTP's by construction: its γ is the one
   with the most tokens per forward on val.
   The chosen values go into ckpt_sbd.pt (sample.py uses them by default) and out_dir/report.json.
2. On the test split: NTP accuracy of the NTP baseline and of the SBD model itself; SBD at γ_low and
   γ_high and exact SBD for each k (exact completions must equal the SBD model's NTP decoding: checked);
   wall clock of NTP, SBD and exact SBD decoding one problem at a time.
3. One test problem step by step, plain and exact; the γ sweep as a picture (out_dir/sweep.png, with
   matplotlib installed).
NFE speed-up = (forwards NTP decoding needed for the test set) / (forwards SBD decoding needed), every
row decoded until its own stop token ("generate until", SBD.md).
"""

import json
import os
import platform
import sys
import time

import torch

from configurator import configure
from model import autodetect_device, load_checkpoint, save_checkpoint
from sbd import format_steps, ntp_generate, sbd_generate
from task import CharTask

GAMMA_GRID = [0.0, 1e-4, 3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 0.01, 0.02, 0.03, 0.05, 0.1, 0.3, 1.0]
EXACT_GRID = [0.01, 0.03, 0.1, 0.3, 1.0, 1e9]  # 1e9: every masked token at once, one forward per block
EXACT_VAL_PROBLEMS = 200  # the exact mode's γ only sets its speed: a few hundred problems measure it well


def decode(model, task, prompts, mode, k, gamma):
    """One batch of prompts (B, T0) -> (token lists, DecodeStats); mode 'ntp', 'sbd' or 'exact'."""
    args = dict(stop_ids=task.stop_ids, mask_id=task.mask_id)
    if mode == "ntp":
        return ntp_generate(model, prompts, task.max_new_tokens, **args)
    return sbd_generate(model, prompts, k, gamma, max_new_tokens=task.max_new_tokens, verify=mode == "exact",
                        **args)


def batches(task, problems, batch_size):
    """Problems in batches of equal prompt length (a batch shares one length) -> [(indices, (B, T0) prompts)]."""
    by_length = {}
    for i, (prompt, _) in enumerate(problems):
        ids = task.encode_prompt(prompt)
        by_length.setdefault(len(ids), []).append((i, ids))
    for group in by_length.values():
        for start in range(0, len(group), batch_size):
            chunk = group[start:start + batch_size]
            yield [i for i, _ in chunk], torch.tensor([ids for _, ids in chunk])


@torch.no_grad()
def solve(model, task, problems, mode, k=16, gamma=0.0, batch_size=250):
    """Decode and grade every problem -> dict(accuracy %, forwards, tokens, seconds, completions, rejected).

    mode 'exact' decodes one problem at a time (sbd_generate(verify=True) is batch 1)."""
    device = next(model.parameters()).device
    batch_size = 1 if mode == "exact" else batch_size
    completions, forwards, tokens, rejected = [None] * len(problems), 0, 0, 0
    t0 = last_print = time.perf_counter()
    for n_done, (indices, prompts) in enumerate(batches(task, problems, batch_size)):
        out, stats = decode(model, task, prompts.to(device), mode, k, gamma)
        for i, ids in zip(indices, out):
            completions[i] = task.decode(ids)
        forwards, tokens = forwards + sum(stats.nfe), tokens + sum(stats.tokens)
        rejected += sum(stats.rejected or [0])
        if time.perf_counter() - last_print > 30:  # a progress line on long runs (a Llama on a benchmark)
            last_print = time.perf_counter()
            print(f"    {mode} k={k} γ={gamma:g}: {(n_done + 1) * batch_size}/{len(problems)} problems, "
                  f"{last_print - t0:.0f} s")
    correct = sum(task.is_correct(c, reference) for c, (_, reference) in zip(completions, problems))
    return dict(accuracy=100.0 * correct / len(problems), forwards=forwards, tokens=tokens, rejected=rejected,
                seconds=time.perf_counter() - t0, completions=completions)


def tokens_per_forward(r):
    return r["tokens"] / max(r["forwards"], 1)


def within_budget(sweep, floor):
    """The largest γ of an upward sweep [(γ, result)] such that every γ up to it keeps val accuracy >= floor,
    if it decodes with fewer forwards than NTP (tokens per forward > 1); None otherwise."""
    passed = []
    for g, r in sweep:
        if r["accuracy"] < floor:
            break
        passed.append((g, r))
    return passed[-1][0] if passed and tokens_per_forward(passed[-1][1]) > 1 else None


def calibrate(model, task, ntp_val_accuracy, k, low_target, high_target, grid=GAMMA_GRID):
    """-> dict(low=γ or None, high=γ or None, exact=γ, sweep=[(γ, val acc, tok/fwd)], exact_sweep=[...])."""
    val, sweep = task.splits["val"], []
    for g in grid:  # upward; once a γ loses more than high_target, no larger one can be chosen
        r = solve(model, task, val, "sbd", k, g)
        sweep.append((g, r))
        print(f"  calibrate k={k:2d} γ={g:<7g} val accuracy {r['accuracy']:6.2f}%  "
              f"{tokens_per_forward(r):5.2f} tokens/forward")
        if r["accuracy"] < ntp_val_accuracy - high_target:
            break
    exact_sweep = []
    for g in EXACT_GRID:
        r = solve(model, task, val[:EXACT_VAL_PROBLEMS], "exact", k, g)
        exact_sweep.append((g, r))
        print(f"  calibrate exact k={k:2d} γ={g:<7g} {tokens_per_forward(r):5.2f} tokens/forward "
              f"({r['rejected']} drafts rejected on {min(len(val), EXACT_VAL_PROBLEMS)} val problems)")
    return dict(low=within_budget(sweep, ntp_val_accuracy - low_target),
                high=within_budget(sweep, ntp_val_accuracy - high_target),
                exact=max(exact_sweep, key=lambda gr: tokens_per_forward(gr[1]))[0],
                sweep=[(g, r["accuracy"], tokens_per_forward(r)) for g, r in sweep],
                exact_sweep=[(g, tokens_per_forward(r)) for g, r in exact_sweep])


def table_rows(ntp_model, sbd_model, task, calibration, budgets):
    """Table 1 on test -> [(name, result)]; a budget no γ met is a row with result None."""
    test = task.splits["test"]
    baseline = solve(ntp_model, task, test, "ntp")
    sbd_ntp = solve(sbd_model, task, test, "ntp")
    rows = [("NTP baseline", baseline), ("SBD model, NTP decoding", sbd_ntp)]
    for k, chosen in calibration.items():
        for name in ("low", "high"):
            g = chosen[name]
            rows.append((f"SBD k={k} γ_{name}={g:g}" if g is not None else
                         f"SBD k={k} γ_{name}: no γ within {budgets[name]} points on val", 
                         solve(sbd_model, task, test, "sbd", k, g) if g is not None else None))
        exact = solve(sbd_model, task, test, "exact", k, chosen["exact"])
        same = sum(a == b for a, b in zip(exact["completions"], sbd_ntp["completions"]))
        if same != len(test):  # the whole point of the exact mode: never let a difference pass unnoticed
            raise RuntimeError(f"exact SBD k={k} differs from the SBD model's NTP decoding on {len(test) - same} "
                               f"of {len(test)} test problems: a bug, or argmax ties broken differently")
        rows.append((f"SBD exact k={k} γ={chosen['exact']:g}", exact))
    return rows


def print_table(rows, task):
    baseline = rows[0][1]
    print(f"\nTable 1 on {len(task.splits['test'])} held-out test problems of {task.name} (greedy decoding):")
    print(f"{'':34s} {'accuracy':>9s} {'Δ vs NTP':>9s} {'forwards':>9s} {'tok/fwd':>8s} {'NFE speed-up':>13s}")
    for name, r in rows:
        if r is None:
            print(f"{name}")
            continue
        print(f"{name:34s} {r['accuracy']:8.2f}% {r['accuracy'] - baseline['accuracy']:+9.2f} {r['forwards']:9d} "
              f"{tokens_per_forward(r):8.2f} {baseline['forwards'] / r['forwards']:12.2f}x")
    exact = [name for name, r in rows if name.startswith("SBD exact")]
    if exact:
        print(f"exact rows: completions identical to the SBD model's NTP decoding on every test problem (checked)")


def operating_point(calibration):
    """The k whose γ_low decodes with the fewest forwards on val (sample.py's default), or None if no k has one."""
    speed = {k: dict((g, tpf) for g, _, tpf in c["sweep"])[c["low"]] for k, c in calibration.items()
             if c["low"] is not None}
    return max(speed, key=speed.get) if speed else None


def wall_clock(ntp_model, sbd_model, task, calibration, k, n):
    """Seconds to decode the first n test problems one at a time: NTP, SBD at k's γ_low, exact SBD at k."""
    problems = task.splits["test"][:n]
    chosen = calibration[k]
    wall = {"ntp": solve(ntp_model, task, problems, "ntp", batch_size=1)["seconds"]}
    if chosen["low"] is not None:
        wall["sbd"] = solve(sbd_model, task, problems, "sbd", k, chosen["low"], batch_size=1)["seconds"]
    wall["exact"] = solve(sbd_model, task, problems, "exact", k, chosen["exact"])["seconds"]
    parts = [f"NTP {wall['ntp']:.2f} s"]
    if "sbd" in wall:
        parts.append(f"SBD k={k} γ={chosen['low']:g} {wall['sbd']:.2f} s ({wall['ntp'] / wall['sbd']:.2f}x)")
    parts.append(f"exact SBD k={k} γ={chosen['exact']:g} {wall['exact']:.2f} s ({wall['ntp'] / wall['exact']:.2f}x)")
    print(f"\nwall clock, first {len(problems)} test problems one at a time (batch 1, KV cache all): " + ", ".join(parts))
    return wall


def step_views(sbd_model, task, calibration, k):
    """One test problem step by step at k's γ_low (plain), and a problem where the exact mode rejected a draft."""
    device = next(sbd_model.parameters()).device
    chosen = calibration[k]
    views = [("SBD", chosen["low"], False)] if chosen["low"] is not None else []
    for name, g, verify in views + [("exact SBD", chosen["exact"], True)]:
        for prompt, _ in task.splits["test"][:50]:
            ids = torch.tensor([task.encode_prompt(prompt)], device=device)
            _, stats = sbd_generate(sbd_model, ids, k, g, mask_id=task.mask_id, max_new_tokens=task.max_new_tokens,
                                    stop_ids=task.stop_ids, record_steps=True, verify=verify)
            if not verify or stats.rejected[0]:  # show the exact mode where it had something to correct
                break
        print(f"\none test problem, {name} k={k} γ={g:g}, step by step ([x] = revealed by that forward, _ = masked"
              + (", ~x~ = rejected drafts, {y} = NTP's token in their place" if verify else "") + "):")
        print(format_steps(stats.steps, task.decode, task.mask_id, prompt=prompt))


def plot_sweep(calibration, ntp_val_accuracy, path):
    """Val accuracy against tokens per forward, one curve per k, γ_low/γ_high and the exact mode marked.
    matplotlib is optional: without it, say how to get the picture and go on."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no screen needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib to get this sweep as a picture)")
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, c in calibration.items():
        tpf = dict((g, t) for g, _, t in c["sweep"])
        line, = ax.plot([t for _, _, t in c["sweep"]], [a for _, a, _ in c["sweep"]], "o-", label=f"SBD k={k}")
        for name, marker in (("low", "v"), ("high", "^")):
            g = c[name]
            if g is not None:
                acc = dict((g_, a) for g_, a, _ in c["sweep"])[g]
                ax.plot(tpf[g], acc, marker, color=line.get_color(), markersize=12, markerfacecolor="none")
                ax.annotate(f"γ_{name}={g:g}", (tpf[g], acc), textcoords="offset points", xytext=(6, -12))
        best = max(t for _, t in c["exact_sweep"])
        ax.plot(best, ntp_val_accuracy, "*", color=line.get_color(), markersize=14, label=f"exact SBD k={k}")
    ax.axhline(ntp_val_accuracy, color="gray", linestyle="--", label="NTP baseline (1 token/forward)")
    ax.set_xlabel("tokens per forward (= NFE speed-up over NTP)")
    ax.set_ylabel("val accuracy (%)")
    ax.set_title("SBD: accuracy against forwards saved, one point per γ")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(out_dir, device="cpu", ks=(8, 16), low_target=0.5, high_target=2.0, timing_problems=200,
           max_problems=None):
    """Calibrate γ on val, evaluate on test, print the table, store the γ values in ckpt_sbd.pt and the whole
    report in out_dir/report.json. max_problems: only the first max_problems of each split (a smoke run)."""
    ntp_model, _ = load_checkpoint(f"{out_dir}/ckpt_ntp.pt", device)
    sbd_model, checkpoint = load_checkpoint(f"{out_dir}/ckpt_sbd.pt", device)
    task = CharTask(checkpoint["dataset"])
    task.splits = {split: problems[:max_problems] for split, problems in task.splits.items()}
    t0 = time.time()
    ntp_val = solve(ntp_model, task, task.splits["val"], "ntp")["accuracy"]
    print(f"calibrating γ on {len(task.splits['val'])} val problems (NTP baseline {ntp_val:.2f}%): "
          f"γ_low within {low_target} points, γ_high within {high_target}")
    calibration = {k: calibrate(sbd_model, task, ntp_val, k, low_target, high_target) for k in ks}
    rows = table_rows(ntp_model, sbd_model, task, calibration, dict(low=low_target, high=high_target))
    print_table(rows, task)

    best_k = operating_point(calibration)
    if best_k is None:
        print(f"\nno k has a γ within {low_target} points of NTP on val: sample.py defaults to the exact mode")
    view_k = best_k or max(ks)
    wall = wall_clock(ntp_model, sbd_model, task, calibration, view_k, timing_problems)
    step_views(sbd_model, task, calibration, view_k)
    picture = plot_sweep(calibration, ntp_val, os.path.join(out_dir, "sweep.png"))

    checkpoint["sbd"].update(k=best_k or max(ks), gamma_low=calibration[best_k]["low"] if best_k else None,
                             gamma_high=calibration[best_k]["high"] if best_k else None,
                             gammas={str(k): [c["low"], c["high"]] for k, c in calibration.items()},
                             gamma_exact={str(k): c["exact"] for k, c in calibration.items()})
    save_checkpoint(checkpoint, f"{out_dir}/ckpt_sbd.pt")
    baseline = rows[0][1]
    summary = dict(val_problems=len(task.splits["val"]), test_problems=len(task.splits["test"]),
                   ntp_val_accuracy=ntp_val, budgets=dict(low=low_target, high=high_target),
                   calibration={str(k): c for k, c in calibration.items()}, operating_k=best_k,
                   rows=[dict(name=name, **({} if r is None else dict(
                       accuracy=r["accuracy"], delta=r["accuracy"] - baseline["accuracy"], forwards=r["forwards"],
                       tokens=r["tokens"], speedup=baseline["forwards"] / r["forwards"])))
                         for name, r in rows],
                   wall_clock=wall, machine=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                   seconds=time.time() - t0, config=checkpoint.get("config"))
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nstored γ per k in {out_dir}/ckpt_sbd.pt, the report in {out_dir}/report.json"
          + (f", the sweep in {picture}" if picture else "") + f" ({time.time() - t0:.0f} s for the report)")
    return rows, calibration, wall


if __name__ == "__main__":
    out_dir = "out-sbd-small"  # the run to evaluate
    device = ""  # '' = autodetect
    timing_problems = 200  # test problems decoded one at a time for the wall-clock comparison
    max_problems = 0  # only the first max_problems of each split (0 = all)
    configure(globals(), sys.argv[1:])
    report(out_dir, device or autodetect_device(), timing_problems=timing_problems, max_problems=max_problems or None)
