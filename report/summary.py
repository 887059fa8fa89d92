"""
report.json: Table 1's rows with their speed-ups, and where the report ran. Rows are keyed by name
without their γ value, so that runs whose calibration chose other γ compare row by row (seeds.py).
Differences between rows are paired: each row decodes the same test problems, so a difference is
judged by the problems on which the two rows disagree (paired standard error, McNemar's test).
"""

import math
import re

import torch

from bench.measure import cpu_name


def summary_rows(rows):
    """Table 1's rows for report.json: each row's numbers and its speed-up over the first row."""
    baseline = rows[0][1]
    return [dict(name=name, key=row_key(name), **({} if r is None else dict(
        accuracy=r["accuracy"], delta=r["accuracy"] - baseline["accuracy"],
        paired=paired(r["correct"], baseline["correct"]),
        forwards=r["forwards"], tokens=r["tokens"], speedup=baseline["forwards"] / r["forwards"],
        seconds=r["seconds"],  # decoding this row's problems (where the report's time goes)
        **({"same_as_ntp": r["same_as_ntp"]} if "same_as_ntp" in r else {}))))
            for name, r in rows]


def machine(model, device):
    """Where the report ran: the processor, threads, dtype and device."""
    return dict(machine=cpu_name(),
                threads=torch.get_num_threads(),
                dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
                device=torch.cuda.get_device_name() if str(device).startswith("cuda")
                else str(device))


def pyplot(picture):
    """matplotlib.pyplot drawing to files (no screen needed), or None without matplotlib, which
    is optional: then say how to get the picture, and the caller goes on without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(pip install matplotlib to get {picture})")
        return None
    return plt


def row_key(name):
    """A row's name without its γ value ('SBD k=16 γ_low=0.01' -> 'SBD k=16 γ_low'), so that runs
    whose calibration chose other values still compare row by row (seeds.py)."""
    return re.sub(r" γ=\S+( p≥\S+)?$", "", re.sub(r"(γ_low|γ_high)(=\S+|: .*)$", r"\1", name))


def paired(correct, reference):
    """Row against reference on the same problems (two lists of bools) -> dict(delta: accuracy
    difference in points, se: its paired standard error, p: McNemar's exact two-sided p-value,
    gained / lost: problems only the row / only the reference solves)."""
    n = len(correct)
    d = [int(a) - int(b) for a, b in zip(correct, reference)]  # +1, 0 or -1 per problem
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(n - 1, 1)
    gained, lost = d.count(1), d.count(-1)
    return dict(delta=100.0 * mean, se=100.0 * math.sqrt(var / n), p=mcnemar(gained, lost),
                gained=gained, lost=lost)


def mcnemar(gained, lost):
    """Exact two-sided McNemar p-value: the discordant problems split as Binomial(m, 1/2)."""
    m, low = gained + lost, min(gained, lost)
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(low + 1)) / 2 ** m
    return min(1.0, 2 * tail)


def agreement(completions, reference):
    """Percent of problems whose completion is identical to the reference decoding's."""
    return 100.0 * sum(a == b for a, b in zip(completions, reference)) / len(reference)


def print_paired(rows):
    """Under Table 1: each row against the NTP baseline (the first row), paired, and its agreement
    with the SBD model's own NTP decoding (the row named so: a reference row may come before it)."""
    baseline, own = rows[0][1], dict(rows)["SBD model, NTP decoding"]
    print("\npaired against the NTP baseline on the same problems (Δ ± standard error, McNemar "
          "p; agree = completions identical to the SBD model's NTP decoding):")
    for name, r in rows[1:]:
        if r is None:
            continue
        s = paired(r["correct"], baseline["correct"])
        agree = agreement(r["completions"], own["completions"])
        print(f"{name:34s} {s['delta']:+6.2f} ± {s['se']:4.2f}  p={s['p']:.3f}  "
              f"+{s['gained']}/-{s['lost']}  agree {agree:5.1f}%")
