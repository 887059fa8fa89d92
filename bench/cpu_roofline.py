"""
The roofline against measured forward times on this CPU (python -m bench --what=roofline; the
settings: bench/__main__.py): the time of a k-token forward on a KV cache (k in roofline_ks, batch
1) of two random GPTs, the demo's shape and the settings' model, next to roofline.py's
max(flops/peak, bytes/bandwidth) for this CPU (peak and bandwidth measured here, or given) and two
fits of t(k) = overhead + roofline(k): least squares over k, and exact at k=1.
"""

import torch

import bench.roofline as roofline
from bench.measure import cpu_name, filled_cache, forward_times, measure_bandwidth, measure_peak
from bench.workload import random_gpt
from configurator import ConfigError


def fits_of(measured, predicted):
    """Two fits of t(k) = overhead + roofline(k) -> (least-squares overhead, overhead at k=1,
    {fit name: {k: fitted seconds}})."""
    ks = list(measured)
    lsq = roofline.fit_overhead([measured[k] for k in ks], [predicted[k] for k in ks])
    at_1 = measured[1] - predicted[1]  # the simpler fit: t(1) = overhead + roofline(1) exactly
    fits = {"least squares": {k: lsq + predicted[k] for k in ks},
            "fit at k=1": {k: at_1 + predicted[k] for k in ks}}
    return lsq, at_1, fits


def print_table(measured, predicted, fits):
    """Per k: measured t(k) and t(k)/t(1), the roofline's, and each fit's ratio and its error."""
    print(f"{'':>33}roofline     overhead + roofline(k), t(k)/t(1) and its error")
    print(f"{'k':>4} {'measured ms':>12} {'t(k)/t(1)':>10} | {'ms':>7} {'ratio':>6} | "
          + " | ".join(f"{fit:>20}" for fit in fits))
    for k in measured:
        ratio = measured[k] / measured[1]
        print(f"{k:4d} {1000 * measured[k]:12.3f} {ratio:10.2f} | {1000 * predicted[k]:7.3f} "
              f"{predicted[k] / predicted[1]:6.2f} | "
              + " | ".join(f"{t[k] / t[1]:12.2f} {t[k] / t[1] / ratio - 1:+7.0%}"
                           for t in fits.values()))


def print_fits(measured, predicted, lsq, at_1, fits):
    """The fitted overheads, and t(16)/t(1) (or the largest k's) measured, predicted and fitted."""
    k = 16 if 16 in measured else max(measured)
    print(f"fitted overhead: {1000 * lsq:.3f} ms "
          f"(least squares over k: the mean of t(k) - roofline(k)), "
          f"{1000 * at_1:.3f} ms (at k=1); "
          f"the roofline alone is {predicted[1] / measured[1]:.0%} of t(1)")
    print(f"t({k})/t(1): measured {measured[k] / measured[1]:.2f}, "
          f"roofline alone {predicted[k] / predicted[1]:.2f}, "
          + ", ".join(f"{fit} {t[k] / t[1]:.2f} "
                      f"({t[k] / t[1] / (measured[k] / measured[1]) - 1:+.0%})"
                      for fit, t in fits.items()) + "; goal: within 25%")


def print_token_price(measured, kv, arch, peak):
    """One more token's cost, measured between the two largest k, against its flops at the peak."""
    k0, k1 = sorted(measured)[-2:]
    per_token = (measured[k1] - measured[k0]) / (k1 - k0)
    flops = (roofline.model_flops(k1, kv, 1, arch) - roofline.model_flops(k0, kv, 1, arch))
    flops /= k1 - k0
    print(f"one more token (k={k0}..{k1}): {1e6 * per_token:.1f} us for {flops / 1e6:.2f} MFLOP = "
          f"{flops / per_token / 1e9:.0f} GFLOP/s, "
          f"{flops / per_token / peak:.0%} of the matmul peak "
          "(the roofline prices it at 100%)")


def roofline_vs_measured(cfg, name, shape, peak):
    """One random GPT: measured t(k) next to the roofline and to the fit overhead + roofline(k)."""
    model = random_gpt(cfg, shape)
    weight_bytes = 4 * sum(p.numel() for p in model.parameters())
    bandwidth = cfg.bandwidth_gbs * 1e9 or measure_bandwidth(weight_bytes)
    hw = dict(peak=peak, attention=peak, bandwidth=bandwidth,
              weight_bytes=4, kv_bytes=4)  # fp32 throughout
    arch = roofline.gpt_shape(shape["n_layer"], shape["n_head"], shape["n_embd"],
                              shape["vocab_size"])
    ks, kv = cfg.roofline_ks, cfg.roofline_kv
    cache = filled_cache(model, kv, max(ks))
    measured = forward_times(model, cache, ks, cfg.roofline_reps, cfg.roofline_rounds, warmup=2)
    predicted = {k: roofline.model_time(k, kv, 1, hw, arch) for k in ks}
    lsq, at_1, fits = fits_of(measured, predicted)
    print(f"\n{name}: {weight_bytes / 1e6:.1f} MB of weights, bandwidth {bandwidth / 1e9:.0f} GB/s "
          f"({'given' if cfg.bandwidth_gbs else 'measured: best copy of a buffer that size'})")
    print_table(measured, predicted, fits)
    print_fits(measured, predicted, lsq, at_1, fits)
    print_token_price(measured, kv, arch, peak)


def bench_roofline(cfg):
    """Two random GPTs' forward times against the roofline: the demo's shape, the settings'."""
    peak = cfg.peak_gflops * 1e9 or measure_peak()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, fp32: peak {peak / 1e9:.0f} GFLOP/s "
          f"({'given' if cfg.peak_gflops else 'measured: best 512x512 matmul'}); "
          f"batch 1, KV cache of {cfg.roofline_kv} tokens; each time is the fastest of "
          f"{cfg.roofline_rounds} rounds' medians of {cfg.roofline_reps} forwards")
    models = [("demo GPT 4L/4h/64d, vocab 32 (config/sbd_small.py)",
               dict(n_layer=4, n_head=4, n_embd=64, vocab_size=32, block_size=73)),
              (f"GPT {cfg.n_layer}L/{cfg.n_head}h/{cfg.n_embd}d, vocab {cfg.vocab_size}",
               dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                    vocab_size=cfg.vocab_size, block_size=cfg.block_size))]
    for name, shape in models:
        if cfg.roofline_kv + max(cfg.roofline_ks) > shape["block_size"]:
            raise ConfigError(f"{name}: KV {cfg.roofline_kv} + {max(cfg.roofline_ks)} tokens is "
                              f"past its context of {shape['block_size']}: "
                              f"lower --roofline_kv or --roofline_ks")
        roofline_vs_measured(cfg, name, shape, peak)
