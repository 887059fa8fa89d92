"""
report.json: Table 1's rows with their speed-ups, and where the report ran. Rows are keyed by name
without their γ value, so that runs whose calibration chose other γ compare row by row (seeds.py).
"""

import json
import os
import platform
import re

import torch


def summary_rows(rows):
    """Table 1's rows for report.json: each row's numbers and its speed-up over the first row."""
    baseline = rows[0][1]
    return [dict(name=name, key=row_key(name), **({} if r is None else dict(
        accuracy=r["accuracy"], delta=r["accuracy"] - baseline["accuracy"],
        forwards=r["forwards"], tokens=r["tokens"], speedup=baseline["forwards"] / r["forwards"],
        **({"same_as_ntp": r["same_as_ntp"]} if "same_as_ntp" in r else {}))))
            for name, r in rows]


def machine(model, device):
    """Where the report ran: the processor, threads, dtype and device."""
    return dict(machine=platform.processor() or platform.machine(),
                threads=torch.get_num_threads(),
                dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
                device=torch.cuda.get_device_name() if str(device).startswith("cuda")
                else str(device))


def write_json(path, record):
    """Write a JSON file atomically: a crash never leaves half a report."""
    with open(f"{path}.tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(f"{path}.tmp", path)


def row_key(name):
    """A row's name without its γ value ('SBD k=16 γ_low=0.01' -> 'SBD k=16 γ_low'), so that runs
    whose calibration chose other values still compare row by row (seeds.py)."""
    return re.sub(r" γ=\S+$", "", re.sub(r"(γ_low|γ_high)(=\S+|: .*)$", r"\1", name))
