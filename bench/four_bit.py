"""
One SmolLM2 block's four matrix products (wqkv, wo, w13, w2: bench/fast_decode.py's layout) with
the weights dense in the decode dtype or in 4 bits (fast_decode.Int4, torch's CPU kernel), for a
few rows at a time: 1 is next-token decoding, 9 and 17 exact SBD's block steps at k = 8 and 16.
Every width and layout is timed once per repetition, interleaved; 'median [min-max]' microseconds
per call of the four, and the 4-bit speed-up, are printed.

    OMP_NUM_THREADS=2 python -m bench.four_bit --threads=2
"""

import sys

import torch

from bench.fast_decode import Dense, Int4
from bench.measure import cpu_name, spread, timings
from configurator import ConfigError, configure, resolve_dtype

widths = (1, 9, 17, 32)  # rows per product
dim, hidden, kv_dim = 576, 1536, 192  # SmolLM2-135M's block
dtype = "auto"  # activations, dense weights and the 4-bit scales: 'auto' = bf16 where native
calls = 50  # calls of the four products per timed repetition
reps = 5
threads = 2
seed = 1337


def block_products(make, dtype, generator):
    """The four products of one block with random weights, as modules made by make."""
    def weight(n_out, n_in):
        return torch.randn(n_out, n_in, generator=generator) * n_in ** -0.5

    return [make(weight(dim + 2 * kv_dim, dim), dtype=dtype), make(weight(dim, dim), dtype=dtype),
            make(weight(2 * hidden, dim), dtype=dtype), make(weight(dim, hidden), dtype=dtype)]


def main(argv):
    configure(globals(), argv)
    if min(widths) < 1 or calls < 1 or reps < 1:
        raise ConfigError(f"widths, calls and reps must be >= 1, got {widths}, {calls}, {reps}")
    torch.set_num_threads(threads)
    decode_dtype = getattr(torch, resolve_dtype(dtype, "cpu"))
    layouts = {name: block_products(make, decode_dtype, torch.Generator().manual_seed(seed))
               for name, make in (("dense", Dense), ("4-bit", Int4))}
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
    for T in widths:
        ratios = [a / b for a, b in zip(times["dense", T], times["4-bit", T])]
        print(f"{T:3d} rows: dense {spread(times['dense', T], 0)}, 4-bit "
              f"{spread(times['4-bit', T], 0)}, 4-bit speed-up {spread(ratios)}x")


if __name__ == "__main__":
    main(sys.argv[1:])
