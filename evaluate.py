"""
The paper's Table 1 for our small task: accuracy and NFE speed-up of SBD against the NTP baseline.

    python evaluate.py --out_dir=out-sbd-small        (train.py runs this at the end of the main job)

1. Calibrate γ on the val split (never test): tiny models are over-confident, so the paper's γ values are
   far too high for them (FINDINGS.md). For each block size, γ_low is the largest γ of a grid whose val
   accuracy stays within low_target points of the NTP model's, γ_high the largest within high_target.
   The chosen values are written into ckpt_sbd.pt, so sample.py uses them by default.
2. On the test split: NTP accuracy of the NTP baseline and of the SBD model itself, SBD accuracy and NFE
   speed-up at γ_low and γ_high for k = 8 and 16, and wall-clock of NTP vs SBD decoding (same batch size).
3. One test problem decoded step by step.
NFE speed-up = (forwards NTP decoding needed for the test set) / (forwards SBD decoding needed), every
row decoded until its own stop token ("generate until", SBD.md).
"""

import sys
import time

import torch

from configurator import configure
from model import autodetect_device, load_checkpoint, save_checkpoint
from sbd import ntp_generate, sbd_generate, format_steps
from task import CharTask

GAMMA_GRID = [0.0, 1e-4, 3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 0.01, 0.02, 0.03, 0.1, 0.3, 1.0]


@torch.no_grad()
def solve(model, task, problems, mode, k=16, gamma=0.0, batch_size=250, rule="entropy"):
    """Decode every problem's completion; -> dict(accuracy %, forwards, tokens, seconds, completions)."""
    max_new = task.seq_len - task.prompt_len
    correct, forwards, tokens, completions = 0, 0, 0, []
    t0 = time.perf_counter()
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        prompt = torch.tensor([task.encode(p) for p, _ in chunk], device=next(model.parameters()).device)
        if mode == "ntp":
            out, stats = ntp_generate(model, prompt, max_new, stop_ids=[task.stop_id], mask_id=task.mask_id)
        else:
            out, stats = sbd_generate(model, prompt, k, gamma, rule, task.mask_id, max_new, [task.stop_id])
        for ids, (_, reference) in zip(out, chunk):
            completions.append(task.decode(ids))
            correct += task.is_correct(completions[-1], reference)
        forwards, tokens = forwards + sum(stats.nfe), tokens + sum(stats.tokens)
    return dict(accuracy=100.0 * correct / len(problems), forwards=forwards, tokens=tokens,
                seconds=time.perf_counter() - t0, completions=completions)


def calibrate(model, task, ntp_val_accuracy, ks, low_target, high_target, rule="entropy"):
    """-> {k: (gamma_low, gamma_high)} from a sweep of GAMMA_GRID on the val split, and the k whose
    γ_low decodes with the fewest forwards on val (the default operating point of sample.py)."""
    chosen, speed_at_low = {}, {}
    for k in ks:
        sweep = [(g, solve(model, task, task.splits["val"], "sbd", k, g, rule=rule)) for g in GAMMA_GRID]
        for g, r in sweep:
            print(f"  calibrate k={k:2d} γ={g:<7g} val accuracy {r['accuracy']:6.2f}%  "
                  f"{r['tokens'] / r['forwards']:5.2f} tokens/forward")
        within = lambda target: [g for g, r in sweep if r["accuracy"] >= ntp_val_accuracy - target]
        low, high = within(low_target), within(high_target)
        chosen[k] = (max(low) if low else 0.0, max(high) if high else 0.0)
        r = dict(sweep)[chosen[k][0]]
        speed_at_low[k] = r["tokens"] / r["forwards"]
    return chosen, max(speed_at_low, key=speed_at_low.get)


def report(out_dir, device="cpu", ks=(8, 16), low_target=0.5, high_target=2.0, timing_problems=200,
           max_problems=None):
    """Calibrate γ on val, evaluate on test, print the table, store the γ values in ckpt_sbd.pt.
    max_problems: use only the first max_problems of each split (a quick smoke run; None = all)."""
    ntp_model, _ = load_checkpoint(f"{out_dir}/ckpt_ntp.pt", device)
    sbd_model, checkpoint = load_checkpoint(f"{out_dir}/ckpt_sbd.pt", device)
    task = CharTask(checkpoint["dataset"])
    task.splits = {split: problems[:max_problems] for split, problems in task.splits.items()}
    test = task.splits["test"]
    t0 = time.time()
    ntp_val = solve(ntp_model, task, task.splits["val"], "ntp")["accuracy"]
    print(f"calibrating γ on {len(task.splits['val'])} val problems (NTP baseline {ntp_val:.2f}%): "
          f"γ_low within {low_target} points, γ_high within {high_target}")
    gammas, best_k = calibrate(sbd_model, task, ntp_val, ks, low_target, high_target)

    baseline = solve(ntp_model, task, test, "ntp")
    rows = [("NTP baseline", baseline), ("SBD model, NTP decoding", solve(sbd_model, task, test, "ntp"))]
    for k in ks:
        for name, g in zip(("γ_low", "γ_high"), gammas[k]):
            rows.append((f"SBD k={k} {name}={g:g}", solve(sbd_model, task, test, "sbd", k, g)))
    print(f"\nTable 1 on {len(test)} held-out test problems of {task.name} (greedy decoding):")
    print(f"{'':28s} {'accuracy':>9s} {'Δ vs NTP':>9s} {'forwards':>9s} {'tok/fwd':>8s} {'NFE speed-up':>13s}")
    for name, r in rows:
        print(f"{name:28s} {r['accuracy']:8.2f}% {r['accuracy'] - baseline['accuracy']:+9.2f} {r['forwards']:9d} "
              f"{r['tokens'] / r['forwards']:8.2f} {baseline['forwards'] / r['forwards']:12.2f}x")

    k, g = best_k, gammas[best_k][0]  # the operating point picked on val
    wall = {mode: solve(model, task, test[:timing_problems], mode, k, g, batch_size=1)
            for mode, model in (("ntp", ntp_model), ("sbd", sbd_model))}
    print(f"\nwall clock, first {timing_problems} test problems one at a time (batch 1, KV cache both): "
          f"NTP {wall['ntp']['seconds']:.2f} s, SBD k={k} γ={g:g} {wall['sbd']['seconds']:.2f} s "
          f"-> {wall['ntp']['seconds'] / wall['sbd']['seconds']:.2f}x faster")

    prompt, reference = test[0]
    out, stats = sbd_generate(sbd_model, torch.tensor([task.encode(prompt)], device=device), k, g, "entropy",
                              task.mask_id, task.seq_len - task.prompt_len, [task.stop_id], record_steps=True)
    print(f"\none test problem, k={k} γ={g:g}, step by step ([x] = revealed by that forward, _ = masked):")
    print(format_steps(stats.steps, task.decode, task.mask_id, prompt=prompt))

    checkpoint["sbd"].update(k=best_k, gamma_low=gammas[best_k][0], gamma_high=gammas[best_k][1],
                             gammas={str(k): list(v) for k, v in gammas.items()})
    save_checkpoint(checkpoint, f"{out_dir}/ckpt_sbd.pt")
    print(f"\nstored γ per k {gammas} in {out_dir}/ckpt_sbd.pt ({time.time() - t0:.0f} s for the report)")
    return rows, gammas, wall


if __name__ == "__main__":
    out_dir = "out-sbd-small"  # the run to evaluate
    device = ""  # '' = autodetect
    timing_problems = 200  # test problems decoded one at a time for the wall-clock comparison
    configure(globals(), sys.argv[1:])
    report(out_dir, device or autodetect_device(), timing_problems=timing_problems)
