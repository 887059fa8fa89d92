"""
Throughput against batch size (python -m bench --what=batch; the settings: bench/__main__.py):
out_dir's checkpoint decodes the same problems at each batch size with NTP, plain and exact SBD,
measured side by side and as this CPU's roofline predicts from the forwards each mode fed; where
SBD stops paying, exact SBD's output against NTP's, and the table as a picture (batch.png).
"""

import os
import statistics

import torch

import bench.roofline as roofline
from bench.measure import (
    cpu_hardware,
    cpu_name,
    filled_cache,
    forward_times,
    roofline_shape,
    spread,
)
from bench.workload import checkpoint_path, decode_problems, load_trained, trained_settings
from report.summary import pyplot


def forward_price(cfg, model, kv):
    """-> (price (width, batch size) -> predicted seconds of a forward on a KV cache of kv tokens,
    hardware, overhead): roofline.model_time on this CPU plus the overhead per forward that the
    roofline leaves out, measured as t(1) minus the roofline's t(1)."""
    hw, shape = cpu_hardware(model, cfg.peak_gflops, cfg.bandwidth_gbs), roofline_shape(model)
    t1 = forward_times(model, filled_cache(model, kv, 40), [1], cfg.timing_repeats)[1]
    overhead = t1 - roofline.model_time(1, kv, 1, hw, shape)

    def price(width, batch_size):
        return overhead + roofline.model_time(width, kv, batch_size, hw, shape)

    return price, hw, overhead


def decode_at(model, task, problems, settings, ntp, batch_size, price):
    """Every problem decoded in batches of batch_size -> (output ids in problem order, tokens/s
    measured, tokens/s the price (forward_price) predicts, tokens per forward per row). Each mode
    decodes on its own path (NTP: ntp_generate, SBD: sbd_generate, exact: exact_generate)."""
    outputs, all_stats = decode_problems(model, task, problems, settings, batch_size, ntp)
    tokens = sum(sum(stats.tokens) for stats in all_stats)
    seconds = sum(stats.wall_time for stats in all_stats)
    forwards = sum(sum(stats.nfe) for stats in all_stats)
    predicted = sum(price(w, len(stats.tokens)) for stats in all_stats for w in stats.widths)
    return outputs, tokens / seconds, tokens / predicted, tokens / forwards


def print_header(cfg, model, problems, hw, overhead, modes):
    print(f"{checkpoint_path(cfg)}: {len(problems)} problems at each batch size; {cpu_name()}, "
          f"{torch.get_num_threads()} threads, {next(model.parameters()).dtype}; roofline: "
          f"{hw['peak'] / 1e9:.0f} GFLOP/s, {hw['bandwidth'] / 1e9:.0f} GB/s, plus "
          f"{1000 * overhead:.2f} ms per forward")
    print(f"{'batch':>5} "
          + " ".join(f"{m + ' tok/s':>20} {'x NTP':>17} {'pred.':>6}" for m in modes)
          + f" {'tok/fwd per row':>16}")


def print_row(batch_size, cells, per_row):
    """cells {mode: ([measured tok/s per repetition], predicted tok/s)}, per_row {mode: tok/fwd
    per row}. Each mode's tok/s and its ratio to NTP's (per repetition) as median [min-max]."""
    ntp_rates, ntp_pred = cells["NTP"]
    print(f"{batch_size:5d} "
          + " ".join(f"{spread(rates, 0):>20} "
                     f"{spread([r / n for r, n in zip(rates, ntp_rates)]):>16}x "
                     f"{pred / ntp_pred:5.2f}x"
                     for rates, pred in cells.values())
          + "  " + ", ".join(f"{m} {v:.2f}" for m, v in per_row.items() if m != "NTP"))


def print_verdicts(table, outputs, batch_sizes, n_problems):
    """Where each SBD mode stops paying, and exact SBD's output against NTP's at every size."""
    for mode in (m for m in table[batch_sizes[0]] if m != "NTP"):
        slower = [B for B in batch_sizes if statistics.median(table[B][mode][0])
                  <= statistics.median(table[B]["NTP"][0])]
        where = f"from batch {slower[0]} on" if slower else f"at none of {list(batch_sizes)}"
        print(f"{mode} stops paying (no more tokens/s than NTP) {where}")
    alone = outputs["NTP", min(batch_sizes)]  # NTP, each row as alone as the sizes go
    for B in batch_sizes:
        same = sum(a == b for a, b in zip(outputs["exact SBD", B], alone))
        print(f"exact SBD at batch {B}: output identical to NTP at batch {min(batch_sizes)} on "
              f"{same} of {n_problems} problems")


def bench_batch(cfg):
    """Tokens per second of NTP, plain SBD and exact SBD against batch size, measured side by side,
    and what the roofline of this CPU predicts from the forwards each decode fed (widths)."""
    model, task, problems, checkpoint, calibration = load_trained(cfg, cfg.batch_problems)
    plain, exact = trained_settings(cfg, checkpoint, calibration)
    modes = {"NTP": (exact, True), "exact SBD": (exact, False)}
    if plain:
        modes["SBD"] = (plain, False)
    n_prompt = len(task.encode_prompt(problems[0][0]))
    kv = n_prompt + task.max_new_tokens // 2  # a mid-answer context for the roofline
    price, hw, overhead = forward_price(cfg, model, kv)
    print_header(cfg, model, problems, hw, overhead, modes)
    table, outputs = {}, {}  # table[B][mode] = ([measured tok/s per repetition], predicted)
    for B in cfg.batch_sizes:
        table[B], per_row = {mode: ([], None) for mode in modes}, {}
        for settings, ntp in modes.values():  # warm-up at this batch size, untimed
            decode_problems(model, task, problems[:B], settings, B, ntp)
        for _ in range(cfg.repeats):  # interleaved: NTP, exact, SBD, NTP, ...
            for mode, (settings, ntp) in modes.items():
                outputs[mode, B], rate, predicted, per_row[mode] = decode_at(
                    model, task, problems, settings, ntp, B, price)
                table[B][mode] = (table[B][mode][0] + [rate], predicted)
        print_row(B, table[B], per_row)
    print_verdicts(table, outputs, cfg.batch_sizes, len(problems))
    plot_batch(table, os.path.join(cfg.out_dir, "batch.png"))


def plot_batch(table, path):
    """Tokens per second against batch size per mode (measured, solid; roofline, dashed)."""
    plt = pyplot("this table as a picture")
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    sizes = sorted(table)
    for mode in table[sizes[0]]:
        line, = ax.plot(sizes, [statistics.median(table[B][mode][0]) for B in sizes], "o-",
                        label=f"{mode}, measured (median)")
        ax.plot(sizes, [table[B][mode][1] for B in sizes], "--", color=line.get_color(),
                label=f"{mode}, roofline")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens per second")
    ax.set_title("Decoding throughput against batch size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"picture: {path}")
