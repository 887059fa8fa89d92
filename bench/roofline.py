"""
The paper's cost model of SBD (appendix A.2, Tables 3-4, Eq. 16), reproduced, and the same model
with the real shapes of Llama-3.1-8B.

    python -m bench.roofline                       # H100 FP8 as the paper: Tables 3-4, both models
    python -m bench.roofline --hardware=h200_bf16  # another preset (HARDWARE below)
    python -m bench.roofline --hardware=custom --peak_tflops=400 --attention_tflops=400 \
                             --bandwidth_gbs=1000 --weight_bytes=2 --kv_bytes=2  # your own chip

The roofline, for a student. A chip does two things at once: arithmetic (at most `peak` flop/s) and
moving bytes between memory and the chip (at most `bandwidth` B/s). An operation that needs `flops`
arithmetic on `bytes` of data cannot finish faster than either, so

    time(op) = max(flops / peak, bytes / bandwidth).

Decoding one token (batch 1) multiplies every weight matrix by ONE vector: 2 flops per weight read,
far below what the chip could compute while the weight streams in (an H100 in FP8 can do ~540 flops
per byte), so the time is bytes / bandwidth and does not care how many tokens share the weight read.
That is SBD's bet: a forward over k tokens reads the same weights as a forward over 1 token, so it
costs about the same until m = k·batch tokens reach the "ridge point"
m ≈ peak / (2·bandwidth / bytes per weight), where the GEMMs turn compute-bound and time grows
with k.
Attention reads the KV cache once per forward as well: long contexts add a cost that also barely
depends on k, until k queries per sequence (times H/KVH query heads per KV head) turn attention
compute-bound too. This file sums max(flops/peak, bytes/bandwidth) over the GEMMs and the attention
of a forward (elementwise work, norms and the embedding lookup are left out) and prints
time(k) / time(1), the slowdown of a k-token forward over a 1-token forward, and Eq. 16's wall-clock
speed-up.

Two models side by side:
- `paper`: the appendix's published code, constants and slips included, so that it reproduces the
  paper's Tables 3 and 4 cell for cell (the tests check it). Its FFN GEMMs use
  HIDDEN·FFN = 4096·16384 = 67M as a dimension (a 4096x too large FFN: 550 GB of FP8 weights per
  layer), its K/V projections are H·KVH = 256 wide instead of KVH·hd = 1024, FFN = 4·hidden with two
  matrices, one layer, no LM head.
- `llama31_8b`: Llama-3.1-8B as it is (docs/llama.md): q/o 4096x4096, GQA k/v 4096x1024, SwiGLU
  w1/w3 4096x14336 and w2 14336x4096, 32 layers, the 128256x4096 LM head once per forward, attention
  over cache + block.
Time in seconds throughout. python -m bench (CPU: bench/cpu_roofline.py, bench/batch.py) and
python -m bench.gpu (GPU) import these formulas and put them next to measured times.
"""

import sys

from configurator import ConfigError, configure

# -----------------------------------------------------------------------------
hardware = "h100_fp8"  # a key of HARDWARE, or 'custom' (then give every number below)
peak_tflops = 0.0  # GEMM peak in TFLOP/s; 0 = the preset's
attention_tflops = 0.0  # attention peak in TFLOP/s; 0 = the preset's
bandwidth_gbs = 0.0  # memory bandwidth in GB/s (1e9 B/s); 0 = the preset's
weight_bytes = 0  # bytes per weight (and per GEMM activation); 0 = the preset's
kv_bytes = 0  # bytes per KV-cache element; 0 = the preset's
batch_sizes = (1, 4, 8, 16)
kv_lengths = tuple(4 ** i for i in range(2, 12))  # KV cache lengths 16, 64, ..., 4M (the paper's)
ks = (1, 2, 4, 8, 16, 32, 64)  # tokens per forward
eq16_k = 16  # block size for Eq. 16
nfe_speedups = (2, 3, 4, 5)  # NFE speed-ups k / l for Eq. 16 (l = forwards per block)
eq16_kv = 16  # KV length for Eq. 16 (the paper's example)
# -----------------------------------------------------------------------------

# peak and attention in flop/s, bandwidth in B/s; dense tensor-core peaks (no 2:4 sparsity)
HARDWARE = {
    # the paper's appendix exactly: FP8 GEMMs, BF16 attention, and 3.35 * 1024^4 B/s (the data
    # sheet's 3.35 TB/s read as TiB/s, 10% more); the tables only reproduce with these numbers
    "h100_fp8": dict(peak=1978e12, attention=989e12, bandwidth=3.35 * 1024 ** 4, weight_bytes=1,
                     kv_bytes=1),
    # NVIDIA H100 SXM5 data sheet: BF16 tensor core 1979 TFLOP/s with sparsity = 989 dense,
    # HBM3 3.35 TB/s
    "h100_bf16": dict(peak=989e12, attention=989e12, bandwidth=3.35e12, weight_bytes=2, kv_bytes=2),
    # NVIDIA H200 SXM data sheet: the H100 SXM's tensor cores (989 dense BF16), HBM3e 4.8 TB/s
    "h200_bf16": dict(peak=989e12, attention=989e12, bandwidth=4.8e12, weight_bytes=2, kv_bytes=2),
    # NVIDIA A100 data sheet, SXM4 80GB: BF16 tensor core 312 TFLOP/s dense, HBM2e 2039 GB/s
    "a100_bf16": dict(peak=312e12, attention=312e12, bandwidth=2.039e12, weight_bytes=2,
                      kv_bytes=2),
}

# the appendix's constants (an "8B" model as its code states it)
PAPER = dict(hidden=4096, ffn=4 * 4096, n_heads=32, n_kv_heads=8, head_dim=128)
# Llama-3.1-8B (docs/llama.md); ffn_matrices: 3 for SwiGLU (w1, w3, w2), 2 for GPT-2 (c_fc, c_proj)
LLAMA31_8B = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336,
                  ffn_matrices=3, vocab=128256)


def op_time(flops, nbytes, peak, bandwidth):
    """The roofline: time = max(flops / peak, bytes / bandwidth)."""
    return max(flops / peak, nbytes / bandwidth)


def gemm_cost(m, n, k, elem_bytes):
    """y[m, n] = x[m, k] @ w[k, n] -> (flops, bytes): flops = 2·m·n·k,
    bytes = (m·k + n·k + m·n)·elem_bytes (read x and w, write y; the appendix's gemm, both
    models)."""
    return 2 * m * n * k, (m * k + n * k + m * n) * elem_bytes


# -----------------------------------------------------------------------------
# `paper`: the appendix code as published (docs/method.md describes it in words)


def paper_gemm(m, n, k, hw):
    """The appendix's gemm: time = max((m·k + n·k + m·n)·BYTES / BW, 2·m·n·k / PEAK)."""
    return op_time(*gemm_cost(m, n, k, hw["weight_bytes"]), hw["peak"], hw["bandwidth"])


def paper_attention(block, kv, bs, hw):
    """The appendix's attention over kv cached tokens (the block's own keys are not counted),
    nt = block·bs: bytes = 2·nt·H·hd·BYTES (q in, out) + 2·bs·kv·KVH·hd·KV_BYTES (k, v);
    flops = 2·(2·nt·kv·H·hd) (two GEMMs); time = max(bytes / BW, flops / PEAK_ATTENTION)."""
    nt, p = block * bs, PAPER
    bytes_q = nt * p["n_heads"] * p["head_dim"] * hw["weight_bytes"]
    bytes_kv = bs * kv * p["n_kv_heads"] * p["head_dim"] * hw["kv_bytes"]
    flops = 2 * (2 * nt * kv * p["n_heads"] * p["head_dim"])
    return op_time(flops, 2 * bytes_q + 2 * bytes_kv, hw["attention"], hw["bandwidth"])


def paper_linear(block, bs, hw):
    """The appendix's linear layers, slips included (nt = block·bs, HIDDEN = 4096, FFN = 16384):
    gemm(nt, HIDDEN, HIDDEN·FFN) + gemm(nt, HIDDEN·FFN, HIDDEN)   FFN, HIDDEN·FFN = 67M as a dim
    + gemm(nt, HIDDEN, H·hd) + 2·gemm(nt, HIDDEN, H·KVH)          q, k/v (H·KVH = 256, not KVH·hd)
    + gemm(nt, H·hd, HIDDEN)                                      o."""
    nt, p = block * bs, PAPER
    hidden, heads = p["hidden"], p["n_heads"] * p["head_dim"]
    return (paper_gemm(nt, hidden, hidden * p["ffn"], hw)
            + paper_gemm(nt, hidden * p["ffn"], hidden, hw)
            + paper_gemm(nt, hidden, heads, hw)
            + 2 * paper_gemm(nt, hidden, p["n_heads"] * p["n_kv_heads"], hw)
            + paper_gemm(nt, heads, hidden, hw))


def paper_time(block, kv, bs, hw):
    """The appendix's forward: time(block) = attention + linear, one layer, no LM head."""
    return paper_attention(block, kv, bs, hw) + paper_linear(block, bs, hw)


# -----------------------------------------------------------------------------
# the real shapes: one decoder layer, matmul by matmul (Llama-3.1-8B; GPT-2 shapes: python -m bench)


def attention_cost(block, kv, bs, shape, act_bytes, kv_bytes):
    """Fused attention of `block` new queries per sequence over keys = kv cached + block new tokens
    (an SBD block attends to the cache and to itself; causal masking in the new tokens is ignored)
    -> (flops, bytes): flops = 2·(2·bs·block·keys·H·hd) (scores Q·Kᵀ and P·V),
    bytes = 2·bs·block·H·hd·act_bytes (q in, out) + 2·bs·keys·KVH·hd·kv_bytes (k, v read once)."""
    H, KVH, hd = shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    keys = kv + block
    flops = 2 * (2 * bs * block * keys * H * hd)
    nbytes = 2 * bs * block * H * hd * act_bytes + 2 * bs * keys * KVH * hd * kv_bytes
    return flops, nbytes


def layer_ops(block, kv, bs, shape, hw):
    """Every matmul of one decoder layer as [(name, flops, bytes, peak)], nt = bs·block tokens in.
    Llama: wq (dim -> H·hd), wk and wv (dim -> KVH·hd = 1024, GQA), attention, wo (H·hd -> dim),
    w1 and w3 (dim -> ffn, SwiGLU's gate and up), w2 (ffn -> dim).
    GPT-2 (ffn_matrices=2): c_fc, c_proj."""
    nt, dim, ffn, wb = bs * block, shape["dim"], shape["ffn"], hw["weight_bytes"]
    q_width = shape["n_heads"] * shape["head_dim"]
    kv_width = shape["n_kv_heads"] * shape["head_dim"]
    gemms = [("wq", nt, q_width, dim), ("wk", nt, kv_width, dim), ("wv", nt, kv_width, dim),
             ("wo", nt, dim, q_width), ("w1", nt, ffn, dim), ("w2", nt, dim, ffn)]
    if shape["ffn_matrices"] == 3:
        gemms.append(("w3", nt, ffn, dim))
    ops = [(name, *gemm_cost(m, n, k, wb), hw["peak"]) for name, m, n, k in gemms]
    attention = attention_cost(block, kv, bs, shape, wb, hw["kv_bytes"])
    ops.append(("attention", *attention, hw["attention"]))
    return ops


def layer_flops(block, kv, bs, shape):
    """Flops of one decoder layer for `block` tokens per sequence (the tests hand-count it)."""
    unit = dict(peak=1, attention=1, bandwidth=1, weight_bytes=1, kv_bytes=1)  # flops don't need it
    return sum(flops for _, flops, _, _ in layer_ops(block, kv, bs, shape, unit))


def model_flops(block, kv, bs, shape):
    """Flops of a whole forward: n_layers · layer_flops + the LM head's 2·nt·dim·vocab."""
    return (shape["n_layers"] * layer_flops(block, kv, bs, shape)
            + 2 * bs * block * shape["dim"] * shape["vocab"])


def lm_head_time(block, bs, shape, hw):
    """The output head, once per forward: gemm(nt, vocab, dim) (logits for every token in)."""
    return op_time(*gemm_cost(bs * block, shape["vocab"], shape["dim"], hw["weight_bytes"]),
                   hw["peak"], hw["bandwidth"])


def model_time(block, kv, bs, hw, shape=LLAMA31_8B):
    """A forward of the real model: n_layers · Σ over the layer's ops of
    max(flops/peak, bytes/bandwidth), plus the LM head."""
    per_layer = sum(op_time(f, b, peak, hw["bandwidth"])
                    for _, f, b, peak in layer_ops(block, kv, bs, shape, hw))
    return shape["n_layers"] * per_layer + lm_head_time(block, bs, shape, hw)


def llama_time(block, kv, bs, hw):
    """model_time with Llama-3.1-8B's shapes (the `llama31_8b` model)."""
    return model_time(block, kv, bs, hw, LLAMA31_8B)


def gpt_shape(n_layer, n_head, n_embd, vocab_size):
    """model.GPT's shapes for model_time: c_attn = wq/wk/wv side by side, c_proj = wo, MLP c_fc
    4·n_embd wide."""
    return dict(dim=n_embd, n_layers=n_layer, n_heads=n_head, n_kv_heads=n_head,
                head_dim=n_embd // n_head, ffn=4 * n_embd, ffn_matrices=2, vocab=vocab_size)


MODELS = {"paper": paper_time, "llama31_8b": llama_time}


# -----------------------------------------------------------------------------
# what the tables print


def slowdown(time_fn, k, kv, bs, hw):
    """time(k) / time(1): what a k-token forward costs relative to a 1-token one (Tables 3-4)."""
    return time_fn(k, kv, bs, hw) / time_fn(1, kv, bs, hw)


def eq16(time_fn, k, n_forwards, kv, bs, hw):
    """Eq. 16, the wall-clock speed-up of a block of k tokens decoded in l = n_forwards forwards
    over k NTP forwards: k·time(1) / (time(2k) + (l-1)·time(k)). The first forward of a block feeds
    2k tokens: it also commits the previous block to the KV cache."""
    return k * time_fn(1, kv, bs, hw) / (time_fn(2 * k, kv, bs, hw)
                                         + (n_forwards - 1) * time_fn(k, kv, bs, hw))


def fit_overhead(measured, predicted):
    """Least squares fit of measured t(k) = overhead + roofline(k) over k, one free parameter:
    overhead = mean over k of (t(k) - roofline(k)). Both are lists in seconds, one entry per k."""
    return sum(t - r for t, r in zip(measured, predicted)) / len(measured)


def resolve_hardware(name, peak_tflops=0.0, attention_tflops=0.0, bandwidth_gbs=0.0, weight_bytes=0,
                     kv_bytes=0):
    """A preset of HARDWARE, any non-zero number overridden, or 'custom' with every number given."""
    if name != "custom" and name not in HARDWARE:
        raise ConfigError(f"hardware must be one of {', '.join(HARDWARE)} or custom, got {name!r}")
    hw = dict(HARDWARE.get(name, {}))
    given = dict(peak=peak_tflops * 1e12, attention=attention_tflops * 1e12,
                 bandwidth=bandwidth_gbs * 1e9, weight_bytes=weight_bytes, kv_bytes=kv_bytes)
    hw.update({key: value for key, value in given.items() if value})
    missing = [key for key in given if key not in hw]
    if missing:
        raise ConfigError(f"hardware=custom needs every number: missing {', '.join(missing)} "
                         "(--peak_tflops, --attention_tflops, --bandwidth_gbs, --weight_bytes, "
                         "--kv_bytes)")
    return hw


def kv_name(n):
    """16 -> '16', 1024 -> '1k', 4194304 -> '4M'."""
    for unit, size in (("M", 1024 ** 2), ("k", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def print_tables(hw):
    """Per batch size: time(k)/time(1) over KV lengths and k, the two models side by side."""
    cols = " ".join(f"{k:>6}" for k in ks)
    for bs in batch_sizes:
        print(f"\nbatch {bs}: time(k) / time(1)   (left: paper, right: llama31_8b; columns k)")
        print(f"{'KV':>6} | {cols} | {cols}")
        for kv in kv_lengths:
            sides = [" ".join(f"{slowdown(fn, k, kv, bs, hw):6.3f}" for k in ks)
                     for fn in MODELS.values()]
            print(f"{kv_name(kv):>6} | {sides[0]} | {sides[1]}")


def print_differences(hw):
    """The paper's headline cells next to the corrected model, and where the two differ most."""
    print("\nkey cells, time(k)/time(1)      paper  llama31_8b   "
          "the paper prints (H100 FP8, docs/method.md)")
    for bs, kv, k, printed in ((1, 16, 16, "1.004"), (1, 16, 64, "1.015"), (16, 16, 64, "3.799"),
                               (16, 1024, 64, "-"), (1, 4 * 1024 ** 2, 64, "1.029"),
                               (16, 4 * 1024 ** 2, 64, "3.422")):
        paper, real = slowdown(paper_time, k, kv, bs, hw), slowdown(llama_time, k, kv, bs, hw)
        print(f"  batch {bs:2d}, KV {kv_name(kv):>3}, k={k:2d}      "
              f"{paper:7.3f}  {real:10.3f}   {printed}")
    print("largest differences per batch size (llama31_8b / paper - 1):")
    for bs in batch_sizes:
        cells = [(slowdown(llama_time, k, kv, bs, hw) / slowdown(paper_time, k, kv, bs, hw) - 1,
                  kv, k) for kv in kv_lengths for k in ks]
        low, high = min(cells), max(cells)
        print(f"  batch {bs:2d}: from {low[0]:+.1%} (KV {kv_name(low[1])}, k={low[2]}) "
              f"to {high[0]:+.1%} (KV {kv_name(high[1])}, k={high[2]})")


def print_eq16(hw):
    """Eq. 16 for k = eq16_k at each NFE speed-up (l = k / NFE speed-up forwards per block), both
    models."""
    print(f"\nEq. 16, k={eq16_k}, KV {kv_name(eq16_kv)}: "
          f"wall-clock speed-up for an NFE speed-up of {', '.join(map(str, nfe_speedups))}   "
          "(paper -> llama31_8b; the paper: NFE 4, batch 1 -> 3.982)")
    for bs in batch_sizes:
        pairs = [f"NFE {s}: {eq16(paper_time, eq16_k, eq16_k / s, eq16_kv, bs, hw):.3f} -> "
                 f"{eq16(llama_time, eq16_k, eq16_k / s, eq16_kv, bs, hw):.3f}"
                 for s in nfe_speedups]
        print(f"  batch {bs:2d}: " + "   ".join(pairs))


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    hw = resolve_hardware(hardware, peak_tflops, attention_tflops, bandwidth_gbs, weight_bytes,
                          kv_bytes)
    ridge = hw["peak"] * hw["weight_bytes"] / (2 * hw["bandwidth"])
    print(f"hardware {hardware}: GEMM peak {hw['peak'] / 1e12:g} TFLOP/s, "
          f"attention {hw['attention'] / 1e12:g} TFLOP/s, "
          f"bandwidth {hw['bandwidth'] / 1e9:g} GB/s, {hw['weight_bytes']} B per weight, "
          f"{hw['kv_bytes']} B per KV element; GEMM ridge point {ridge:.0f} tokens")
    print_tables(hw)
    print_differences(hw)
    print_eq16(hw)
    p, q = PAPER, LLAMA31_8B  # weights of one layer: FFN + q/o + k/v
    paper_weights = p["hidden"] * (2 * p["hidden"] * p["ffn"] + 2 * p["n_heads"] * p["head_dim"]
                                   + 2 * p["n_heads"] * p["n_kv_heads"])
    llama_weights = q["dim"] * (3 * q["ffn"] + 2 * q["n_heads"] * q["head_dim"]
                                + 2 * q["n_kv_heads"] * q["head_dim"])
    print(f"\nNotes. `paper` reproduces the paper's Tables 3-4 only with hardware=h100_fp8. "
          f"Its FFN of 67M columns makes its layer's weights\n"
          f"{paper_weights / llama_weights:.0f}x heavier than Llama-3.1-8B's "
          f"({paper_weights / 1e9:.0f}G vs {llama_weights / 1e6:.0f}M), "
          "so the KV cache barely counts even at 4M tokens; with the real shapes the cache\n"
          "dominates long contexts (at batch 1 and KV 4M a 64-token block turns attention "
          "compute-bound). Llama-3.1-8B's context is\n128k: rows past it (and caches past the "
          "GPU's memory: 4M tokens at batch 16) are the formulas' extrapolation, as in the paper.")
