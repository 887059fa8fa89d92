"""
What the CPU benchmarks measure besides decoding: this CPU (its name, matmul peak and memory
bandwidth, as roofline.py's hardware) and the time of one forward of k tokens on a KV cache.
"""

import statistics
import time

import torch

import bench.roofline as roofline
from decode import hybrid_forward


def cpu_name():
    """The CPU's model name and its bf16 units, which decide bf16 speed: 'Intel(R) Xeon(R)
    Processor (AMX, AVX512-BF16)', or 'unknown CPU' off Linux."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    units = [unit for flag, unit in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))
             if flag in flags]
    return f"{name} ({', '.join(units) or 'no bf16 units'})"


def spread(values, digits=2):
    """'median [min-max]' of a measurement repeated: the range shows how noisy the machine was."""
    return (f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-"
            f"{max(values):.{digits}f}]")


def timings(fn, reps, warmup):
    """Seconds of each of reps calls of fn(), after warmup untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_time(fn, n):
    """The fastest of n calls of fn() after one warm-up: a ceiling is what the machine can do
    undisturbed."""
    return min(timings(fn, n, 1))


def median_time(fn, reps, warmup):
    """The median seconds of reps calls of fn(), after warmup untimed ones."""
    return statistics.median(timings(fn, reps, warmup))


def measure_peak(dtype=torch.float32):
    """This CPU's peak flop/s at torch's thread count: the best of 20 512x512 matmuls in dtype."""
    a = torch.randn(512, 512, dtype=dtype)
    return 2 * 512 ** 3 / best_time(lambda: a @ a, 20)


def measure_bandwidth(nbytes):
    """Bytes/s of copying a buffer of nbytes (bytes read + bytes written, as STREAM's copy), best of
    20. Sized like a model's weights, it measures the memory level that holds them: the last-level
    cache for the demo's 3 MB (weights stay there between forwards), DRAM for the 11M model's 45 MB.
    """
    x = torch.randn(nbytes // 4)
    y = torch.empty_like(x)
    return 2 * x.nbytes / best_time(lambda: y.copy_(x), 20)


def cpu_hardware(model, peak_gflops=0.0, bandwidth_gbs=0.0):
    """This CPU as roofline.py's hardware: peak flop/s and bandwidth in the model's dtype, given
    (GFLOP/s, GB/s) or, where 0, measured (bandwidth: a copy the size of the model's weights)."""
    dtype = next(model.parameters()).dtype
    peak = peak_gflops * 1e9 or measure_peak(dtype)
    nbytes = dtype.itemsize * sum(p.numel() for p in model.parameters())
    bandwidth = bandwidth_gbs * 1e9 or measure_bandwidth(nbytes)
    return dict(peak=peak, attention=peak, bandwidth=bandwidth, weight_bytes=dtype.itemsize,
                kv_bytes=dtype.itemsize)


def roofline_shape(model):
    """The model's shapes in roofline.model_time's terms."""
    c = model.config
    if hasattr(model, "transformer"):
        return roofline.gpt_shape(c.n_layer, c.n_head, c.n_embd, c.vocab_size)
    return dict(dim=c.dim, n_layers=c.n_layers, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
                head_dim=c.head_dim, ffn=c.ffn_hidden, ffn_matrices=3, vocab=c.vocab_size)


@torch.inference_mode()
def filled_cache(model, n, room):
    """A batch-1 KV cache in the model's dtype holding n tokens, with room for `room` more."""
    device = next(model.parameters()).device
    cache = model.new_cache(1, n + room, device, dtype=next(model.parameters()).dtype)
    model(torch.zeros(1, n, dtype=torch.long, device=device), cache=cache)
    return cache


@torch.inference_mode()
def forward_times(model, cache, widths, reps, rounds=1, warmup=3):
    """{k: seconds of one forward of k tokens on top of the cache} for k in widths, batch 1: each
    round times every k in turn (the median of reps forwards after warmup untimed ones), and the
    fastest round counts (another job on the core only ever slows a round down).

    k = 1 is an NTP step (no mask, as serving.batched.ntp_generate); k > 1 is an SBD block that
    attends to the cache and to itself (decode.hybrid_forward, sbd.hybrid_mask), nothing committed:
    its keys are written into the cache's spare slots (a view, no copy) and dropped. The cache is
    unchanged.
    """
    tokens = torch.zeros(1, max(widths), dtype=torch.long, device=cache.k[0].device)
    per_round = {k: [] for k in widths}
    for _ in range(rounds):
        for k in widths:
            block = tokens[:, :k]  # (1, k)
            per_round[k].append(median_time(lambda: hybrid_forward(model, cache, block, 0), reps,
                                            warmup))
    return {k: min(times) for k, times in per_round.items()}
