"""
One SmolLM2 block's four matrix products (wqkv, wo, w13, w2: serving/layout.py's
layout) with the weights dense in the decode dtype, in 8 bits or in 4 bits (DecodeLinear on torch's
own CPU kernels, _weight_int8pack_mm and _weight_int4pack_mm_for_cpu), for a few rows at a time:
1 is next-token decoding, 9 and 17 exact SBD's block steps at k = 8 and 16, 32 its widest at k =
16. Every width and layout is timed once per repetition, interleaved; 'median [min-max]'
microseconds per call of the four, and each quantized layout's speed-up over dense, are printed,
and last the fastest layout per width: what --quantized_rows of sample.py, evaluate.py and
bench.fast_bench should be on this CPU (quantized up to the widest width where it wins).

    OMP_NUM_THREADS=2 python -m bench.four_bit --threads=2
"""

import math
import statistics
import sys

import torch

from bench.measure import cpu_name, spread, timings
from configurator import ConfigError, configure, resolve_dtype
from serving.layout import DecodeLinear

widths = (1, 2, 4, 9, 17, 32)  # rows per product
dim, hidden, kv_dim = 576, 1536, 192  # SmolLM2-135M's block
dtype = "auto"  # activations, dense weights and the scales: 'auto' = bf16 where native
calls = 50  # calls of the four products per timed repetition
reps = 5
threads = 2
seed = 1337


def block_products(kind, dtype, generator):
    """The four products of one block with random weights, laid out as `kind` for every width."""
    def weight(n_out, n_in):
        return torch.randn(n_out, n_in, generator=generator) * n_in ** -0.5

    shapes = ((dim + 2 * kv_dim, dim), (dim, dim), (2 * hidden, dim), (dim, hidden))
    return [DecodeLinear([weight(*s)], None, dtype, kind, math.inf) for s in shapes]


def main(argv):
    configure(globals(), argv)
    if min(widths) < 1 or calls < 1 or reps < 1:
        raise ConfigError(f"widths, calls and reps must be >= 1, got {widths}, {calls}, {reps}")
    torch.set_num_threads(threads)
    decode_dtype = getattr(torch, resolve_dtype(dtype, "cpu"))
    layouts = {name: block_products(kind, decode_dtype, torch.Generator().manual_seed(seed))
               for name, kind in (("dense", "trained"), ("int8", "int8"), ("4-bit", "int4"))}
    inputs = {T: [torch.randn(T, n_in).to(decode_dtype) for n_in in (dim, dim, dim, hidden)]
              for T in widths}

    def run(products, xs):
        def fn():
            for _ in range(calls):
                for product, x in zip(products, xs):
                    product(x)
        return fn

    times = {(name, T): [] for name in layouts for T in widths}
    with torch.inference_mode():
        for _ in range(reps):
            for T in widths:
                for name, products in layouts.items():
                    t = timings(run(products, inputs[T]), 1, 1)[0]
                    times[name, T].append(1e6 * t / calls)
    print(f"{cpu_name()}, {threads} threads, {decode_dtype}; one block's four products, "
          f"microseconds per call, median [min-max] of {reps}:")
    fastest = {}
    for T in widths:
        cells = [f"{name} {spread(times[name, T], 0)}" for name in layouts]
        for name in ("int8", "4-bit"):
            ratios = [a / b for a, b in zip(times["dense", T], times[name, T])]
            cells.append(f"{name} speed-up {spread(ratios)}x")
        print(f"{T:3d} rows: " + ", ".join(cells))
        fastest[T] = min(layouts, key=lambda name: statistics.median(times[name, T]))
    print("fastest per width: " + ", ".join(f"{T} rows {name}" for T, name in fastest.items()))
    for name, kind in (("int8", "int8"), ("4-bit", "int4")):
        wins = [T for T in widths if fastest[T] == name]
        if wins:
            print(f"--weights={kind}: --quantized_rows={max(wins)}")


if __name__ == "__main__":
    main(sys.argv[1:])
