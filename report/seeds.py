"""
Run the main job over several seeds and summarise Table 1 as mean and range per row: one run's table
is one draw, and the small demo's k=16 results swing by points and x-fold speed-ups from seed to
seed.

    python -m report.seeds config/sbd_small.py --seeds=1,2,3  # train + report each, summarise
    python -m report.seeds config/sbd_small.py --seeds=1,2,3 --sbd_iters=2000  # any override
    python -m report.seeds --summarize=out-sbd-small-seed1,out-sbd-small-seed2  # finished runs

Each seed runs `python train.py <config> --seed=<s> --out_dir=<out_dir>-seed<s> <overrides>` one
after the other (two torch jobs at once on a small CPU slow each other down 3-5x), skipping a seed
whose run already has a report.json (evaluate.py writes it), so an interrupted sweep continues where
it stopped.
"""

import json
import os
import statistics
import subprocess
import sys


def run_seed(config_file, seed, out_dir, overrides):
    if os.path.exists(os.path.join(out_dir, "report.json")):
        print(f"seed {seed}: {out_dir}/report.json exists, not run again")
        return
    cmd = [sys.executable, "train.py", config_file, f"--seed={seed}", f"--out_dir={out_dir}",
           *overrides]
    print(f"seed {seed}: {' '.join(cmd)}", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "main.log"), "w") as log:  # the run's output, as a user sees it
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)


def summarize(out_dirs):
    """Print mean [min, max] of accuracy, Δ vs NTP and NFE speed-up per Table-1 row, over runs."""
    reports = []
    for d in out_dirs:
        with open(os.path.join(d, "report.json")) as f:
            reports.append(json.load(f))
    keys = list(dict.fromkeys(row["key"] for r in reports for row in r["rows"]))  # first-seen order
    print(f"\nTable 1 over {len(reports)} runs ({', '.join(out_dirs)}): mean [min, max]")
    print(f"{'':24s} {'accuracy %':>22s} {'Δ vs NTP':>22s} {'NFE speed-up':>22s}  chosen γ per run")
    for key in keys:
        rows = [next((row for row in r["rows"] if row["key"] == key), None) for r in reports]
        measured = [row for row in rows if row is not None and "accuracy" in row]
        cells = [spread([row[field] for row in measured], fmt) for field, fmt in
                 (("accuracy", "{:.2f}"), ("delta", "{:+.2f}"), ("speedup", "{:.2f}x"))]
        gammas = ["-" if row is None or "accuracy" not in row else row["name"].rsplit("=", 1)[-1]
                  for row in rows]
        if key.startswith("NTP") or key.endswith("NTP decoding"):  # rows without a γ
            gammas = []
        missing = len(reports) - len(measured)
        note = f"  ({missing} of {len(reports)} runs: no γ met the budget)" if missing else ""
        print(f"{key:24s} {cells[0]:>22s} {cells[1]:>22s} {cells[2]:>22s}  "
              f"{' '.join(gammas)}{note}")
    minutes = [r["seconds"] / 60 for r in reports]
    print(f"report time per run: {spread(minutes, '{:.1f}')} min")


def spread(values, fmt):
    if not values:
        return "-"
    return (f"{fmt.format(statistics.mean(values))} "
            f"[{fmt.format(min(values))}, {fmt.format(max(values))}]")


if __name__ == "__main__":
    args = sys.argv[1:]
    options = dict(a[2:].split("=", 1) for a in args
                   if a.startswith("--seeds=") or a.startswith("--summarize="))
    if "summarize" in options:
        summarize(options["summarize"].split(","))
        sys.exit()
    files = [a for a in args if not a.startswith("--")]
    overrides = [a for a in args if a.startswith("--") and not a.startswith("--seeds=")]
    if len(files) != 1 or "seeds" not in options:
        sys.exit(__doc__)
    out_dir = next((a.split("=", 1)[1] for a in overrides if a.startswith("--out_dir=")), None)
    overrides = [a for a in overrides if not a.startswith("--out_dir=")]
    if out_dir is None:  # the config file's out_dir, as train.py would resolve it
        namespace = {}
        exec(open(files[0]).read(), namespace)
        out_dir = namespace.get("out_dir", "out-sbd-small")
    runs = [f"{out_dir}-seed{seed}" for seed in options["seeds"].split(",")]
    for seed, run in zip(options["seeds"].split(","), runs):
        run_seed(files[0], int(seed), run, overrides)
    summarize(runs)
