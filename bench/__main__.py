"""
Decoding benchmarks, measured side by side in one run (timings to read, not a pass/fail test).

    python bench.py --what=kvcache   # NTP with the KV cache vs recomputing the context every step
    python bench.py --what=sbd       # SBD vs NTP: measured, and as Eq. 16 predicts from forwards
    python bench.py --what=roofline  # a k-token forward on a KV cache vs roofline.py's prediction
    python bench.py --what=batch     # tokens/s of NTP, SBD and exact SBD against batch size
    python bench.py --what=adaptive  # exact SBD with and without the adaptive block size

kvcache: a 6-layer, 384-wide GPT decodes new_tokens tokens greedily twice: through the KV cache
(generate.ntp_generate) and the way nanoGPT's sampler does it, one full forward over the whole
context per token.
sbd: the same model and prompts decoded with NTP and with SBD, both through the KV cache, batch 1.
Uses out_dir/ckpt_sbd.pt if it exists (prompts from its task's test split), else a random model.
Besides the measured speed-ups it times a 1-, k- and 2k-token forward on top of a cache and
predicts SBD's wall clock from the forward counts (Eq. 16 of the paper, generalised to the measured
counts): measured / predicted near 1 means the sampler's own work per forward is small next to the
model's.
roofline: the time of a k-token forward on a KV cache (k = 1, 2, ..., 32, batch 1) for two random
GPTs, the demo's shape and the 11M model above, next to roofline.py's max(flops/peak,
bytes/bandwidth) for this CPU (peak and bandwidth measured here, or given) and two fits of
t(k) = overhead + roofline(k): least squares over k, and exact at k=1. On a CPU these tiny models
are bound by per-call overhead, not by flops or bytes: the fitted overhead says by how much, and the
cost of one more token says how far the roofline's price is off.
batch: out_dir's checkpoint decodes the same problems at each of batch_sizes with NTP, plain and
exact SBD; tokens per second side by side, the roofline's prediction from the forwards each mode
fed, where SBD stops paying, and exact SBD's output checked against NTP's at every size (batch.png).
adaptive: exact SBD with adaptive=False and True on out_dir's checkpoint: tokens per forward on
test problems, and batch-1 wall clock against NTP there, on prompts unlike training's and on a
random model of the same shape (the demo), where drafts keep failing.
"""

import collections
import math
import os
import statistics
import sys
import time

import torch

import bench.roofline as roofline
from configurator import ConfigError, configure, resolve_dtype
from exact import decode
from generate import ntp_generate
from model import build_model, dense_mask, load_checkpoint
from sampling import DecodeSettings, read_calibration, settings_for
from sbd import hybrid_mask
from tasks import task_of_checkpoint

# -----------------------------------------------------------------------------
what = "sbd"  # 'kvcache', 'sbd', 'roofline', 'batch' or 'adaptive'
device = "cpu"  # this is a CPU benchmark; timings on an accelerator would need more care
seed = 1337
threads = 0  # torch threads; 0 = default. Never time next to another torch job (docs/findings.md)
# the random model (kvcache always, sbd when out_dir has no checkpoint)
n_layer = 6
n_head = 6
n_embd = 384
block_size = 1200  # positions the model covers: prompt + new tokens must fit
vocab_size = 256
# kvcache
new_tokens = 1000
prompt_len = 16
# sbd
out_dir = "out-sbd-small"  # uses out_dir/ckpt_sbd.pt when it exists
k = 0  # 0 = the checkpoint's operating point (16 for a random model)
gamma = None  # None = evaluate.py's calibration for k (γ_low, the exact mode's), or random_gamma
random_gamma = 16.0  # a random model is near-uniform (H ~ log 256 = 5.5): γ = 16 reveals ~3/forward
rule = "entropy"
num_prompts = 4  # decoded one at a time (batch 1, the setting of Eq. 16)
max_new_tokens = 256
timing_repeats = 30  # forwards per timing of a 1-, k- and 2k-token forward
# batch: throughput against batch size, on out_dir's checkpoint (the demo, or a chat model)
batch_sizes = (1, 4, 16, 64)
batch_problems = 128  # problems decoded at every batch size, in batches of that size
decode_dtype = "float32"  # 'float32', 'bfloat16', or 'auto' (bf16 where the CPU computes it)
# adaptive: exact SBD with and without the adaptive block size, on out_dir's checkpoint
adaptive_problems = 1000  # test problems for tokens per forward
adaptive_batch_size = 250  # ... decoded in batches of this many
unfamiliar_prompts = 200  # prompts decoded one at a time for the wall clock (each case)
# roofline (the demo's shape and the random model above)
roofline_ks = (1, 2, 4, 8, 16, 32)  # tokens per forward
roofline_kv = 40  # KV cache tokens: mid-answer in the demo (13-token prompt, ~59-token answer)
roofline_rounds = 7  # interleaved rounds over all k: the fastest is reported (others are disturbed)
roofline_reps = 10  # timed forwards per k and round (their median is the round's time)
peak_gflops = 0.0  # this CPU's peak in GFLOP/s; 0 = measure it (best of 20 fp32 512x512 matmuls)
bandwidth_gbs = 0.0  # memory bandwidth in GB/s; 0 = measure per model (a copy of its weights' size)
configure(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------


@torch.inference_mode()
def recompute_generate(model, prompt, max_new_tokens):
    """Greedy NTP without a cache, as nanoGPT's sampler: a full forward of the context per token."""
    idx = prompt
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.max_seq_len:])  # (1, T, V)
        idx = torch.cat([idx, logits[:, -1:].argmax(-1)], dim=1)
    return idx[:, prompt.size(1):]


def bench_kvcache():
    torch.manual_seed(seed)
    model = build_model("gpt", n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                        vocab_size=vocab_size).to(device).eval()
    prompt = torch.randint(0, vocab_size, (1, prompt_len), device=device)
    greedy = DecodeSettings(mask_id=None)
    ntp_generate(model, prompt, greedy, 8)  # warm-up
    cached, stats = ntp_generate(model, prompt, greedy, new_tokens)
    t0 = time.perf_counter()
    recomputed = recompute_generate(model, prompt, new_tokens)
    t_recompute = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"GPT {n_layer}L/{n_embd}d ({params:.1f}M parameters), greedy, prompt {prompt_len}, "
          f"{new_tokens} new tokens, {torch.get_num_threads()} threads")
    print(f"KV cache:   {stats.wall_time:7.2f} s  {new_tokens / stats.wall_time:7.1f} tokens/s")
    print(f"recompute:  {t_recompute:7.2f} s  {new_tokens / t_recompute:7.1f} tokens/s")
    print(f"speed-up of the KV cache: {t_recompute / stats.wall_time:.1f}x "
          f"(same tokens: {cached[0] == recomputed[0].tolist()})")


def sbd_setup():
    """-> (model, prompts [(1, T0) tensors], plain settings or None, exact settings, max_new,
    description). A trained checkpoint's k and γ come from its calibration (settings.py) unless
    given: a γ only means something for the block size it was calibrated with."""
    path = os.path.join(out_dir, "ckpt_sbd.pt")
    if not os.path.exists(path):
        torch.manual_seed(seed)
        model = build_model("gpt", n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                            block_size=block_size, vocab_size=vocab_size).to(device).eval()
        prompts = [torch.randint(0, vocab_size - 1, (1, prompt_len), device=device)
                   for _ in range(num_prompts)]
        g = gamma if gamma is not None else random_gamma
        plain = DecodeSettings(mask_id=vocab_size - 1, k=k or 16, gamma=g, rule=rule)
        print(f"no {path}: a random GPT {n_layer}L/{n_embd}d, k={plain.k}, γ={g:g}")
        return (model, prompts, plain, plain.replace(exact=True), max_new_tokens,
                f"random GPT {n_layer}L/{n_embd}d")

    model, checkpoint = load_checkpoint(path, device)
    task, calibration = task_of_checkpoint(checkpoint, path), read_calibration(path, checkpoint)
    prompts = [torch.tensor([task.encode_prompt(p)], device=device)
               for p, _ in task.splits["test"][:num_prompts]]
    exact = settings_for(checkpoint, calibration, k=k or None, gamma=gamma, exact=True, rule=rule)
    try:
        plain = settings_for(checkpoint, calibration, k=exact.k, gamma=gamma, rule=rule)
    except ConfigError as e:
        print(f"plain SBD not timed: {e}")
        plain = None
    print(f"{path}: k={exact.k}, " + (f"γ={plain.gamma:g}, " if plain else "")
          + f"exact γ={exact.gamma:g} ({'given' if gamma is not None else 'calibrated'})")
    return model, prompts, plain, exact, task.max_new_tokens, path


@torch.inference_mode()
def forward_time(model, cache, width):
    """Median seconds of one forward of `width` tokens on top of the cache: a 1-token NTP step, or
    an SBD block of `width` slots attending to the cache and to itself. The cache is restored."""
    n_cached, times = cache.length, []
    tokens = torch.zeros(1, width, dtype=torch.long, device=device)
    mask = None if width == 1 else dense_mask(lambda q, kv: hybrid_mask(q, kv, n_cached), width,
                                              n_cached + width, n_cached, device)
    for _ in range(timing_repeats + 3):
        t0 = time.perf_counter()
        model(tokens, mask=mask, cache=cache, n_commit=0)
        times.append(time.perf_counter() - t0)
    cache.length = n_cached
    return statistics.median(times[3:])  # the first few are warm-up


def bench_sbd():
    model, prompts, plain, exact, max_new, description = sbd_setup()
    modes = {"ntp": exact, "exact": exact, **({"sbd": plain} if plain else {})}
    stats = {mode: [] for mode in modes}
    decode(model, prompts[0], exact, 4)  # warm-up
    for prompt in prompts:  # interleave the modes: a slow moment of the machine hits them alike
        for mode, settings in modes.items():
            stats[mode].append(decode(model, prompt, settings, max_new, ntp=mode == "ntp")[1])
    decode_time = {m: sum(s.wall_time - s.prefill_time for s in st) for m, st in stats.items()}
    n_tokens = {m: sum(s.tokens[0] for s in st) for m, st in stats.items()}
    nfe = {m: sum(s.nfe[0] for s in st) for m, st in stats.items()}
    widths = {m: collections.Counter(w for s in st for w in s.widths) for m, st in stats.items()}

    # forward times of every width the decodes fed, on a cache as long as a mid-answer context
    T0, kk = prompts[0].size(1), exact.k
    context = min(T0 + n_tokens["ntp"] // (2 * len(prompts)), model.max_seq_len - 2 * kk - 1)
    cache = model.new_cache(1, context + 2 * kk + 1, device)
    model(torch.zeros(1, context, dtype=torch.long, device=device), cache=cache)
    t = {w: forward_time(model, cache, w) for w in sorted({1, kk, 2 * kk}.union(*widths.values()))}
    print(f"{description}, {len(prompts)} prompts decoded one at a time, "
          f"{torch.get_num_threads()} threads")
    print(f"forward times on a cache of {context}: t(1) = {1000 * t[1]:.2f} ms, t({kk}) = "
          f"{1000 * t[kk]:.2f} ms, t({2 * kk}) = {1000 * t[2 * kk]:.2f} ms; "
          f"t({kk})/t(1) = {t[kk] / t[1]:.2f}")
    print(f"NTP: {n_tokens['ntp']} tokens in {nfe['ntp']} forwards, decode "
          f"{decode_time['ntp']:.2f} s "
          f"({1000 * decode_time['ntp'] / n_tokens['ntp']:.2f} ms/token)")
    ntp_per_token = decode_time["ntp"] / n_tokens["ntp"]
    for mode in (m for m in ("sbd", "exact") if m in stats):
        s = modes[mode]
        measured = decode_time[mode] / n_tokens[mode]
        predicted = sum(t[w] * n for w, n in widths[mode].items()) / n_tokens[mode]
        blocks = sum(math.ceil(st.tokens[0] / kk) for st in stats[mode])
        forwards_per_block = nfe[mode] / blocks
        eq16 = kk * t[1] / (t[2 * kk] + (forwards_per_block - 1) * t[kk])
        checked = ""
        if mode == "exact":
            checked = (f", {sum(st.accepted[0] for st in stats[mode])} drafts kept, "
                       f"{sum(st.rejected[0] for st in stats[mode])} rejected")
        print(f"{mode_label(s)} k={kk} γ={s.gamma:g}: {n_tokens[mode]} tokens in {nfe[mode]} "
              f"forwards ({n_tokens[mode] / nfe[mode]:.2f} tok/fwd, "
              f"{forwards_per_block:.2f} forwards per block{checked}), decode "
              f"{decode_time[mode]:.2f} s ({1000 * measured:.2f} ms/token)")
        print(f"    wall clock vs NTP: measured {ntp_per_token / measured:.2f}x, predicted "
              f"from the forward times of the widths fed {t[1] / predicted:.2f}x (Eq. 16 with l = "
              f"{forwards_per_block:.2f}: {eq16:.2f}x); measured / predicted = "
              f"{(ntp_per_token / measured) / (t[1] / predicted):.2f}; time beyond the forwards: "
              f"{1000 * (decode_time[mode] - predicted * n_tokens[mode]) / nfe[mode]:.2f} ms per "
              "forward")
    same = all(a.tokens == b.tokens for a, b in zip(stats["ntp"], stats["exact"]))
    print(f"exact SBD output == NTP output on every prompt: {same}")


def mode_label(settings):
    return "exact SBD" if settings.exact else "SBD"


def unfamiliar(task, n, rng):
    """n prompts the demo never saw: not right-aligned, three operands, or characters at random."""
    chars = [c for c in task.chars if c not in (task.meta["mask"], task.meta["stop"])]
    prompts = []
    for i in range(n):
        a, b, c = (rng.randint(0, 999) for _ in range(3))
        kind = i % 3
        text = (f"Q:{a}+{b}=?A:" if kind == 0 else f"Q:{a}+{b}+{c}=?A:".rjust(13) if kind == 1
                else "".join(rng.choice(chars) for _ in range(13)))
        prompts.append(task.encode(text))
    return prompts


def timed(model, prompts, settings, max_new, ntp=False):
    """(seconds, tokens, forwards) of decoding each prompt alone (batch 1)."""
    seconds = tokens = forwards = 0
    for ids in prompts:
        n = min(max_new, model.max_seq_len - len(ids))  # a long unfamiliar prompt leaves less room
        _, stats = decode(model, torch.tensor([ids], device=device), settings, n, ntp=ntp)
        seconds, tokens = seconds + stats.wall_time - stats.prefill_time, tokens + stats.tokens[0]
        forwards += stats.nfe[0]
    return seconds, tokens, forwards


def bench_adaptive():
    """Exact SBD with the adaptive block size against without, side by side: tokens per forward on
    test problems, and batch-1 wall clock against NTP. For the demo also where drafts keep failing
    (prompts unlike training's, and a random model of the same shape)."""
    import random

    model, problems, _, exact, task, path = batch_setup(adaptive_problems)
    print(f"{path}: exact SBD k={exact.k} γ={exact.gamma:g}; {cpu_name()}, "
          f"{torch.get_num_threads()} threads, {next(model.parameters()).dtype}")
    ntp_out, _ = decode_problems(model, task, problems, exact, adaptive_batch_size, ntp=True)
    for adaptive in (False, True):
        out, stats = decode_problems(model, task, problems, exact.replace(adaptive=adaptive),
                                     adaptive_batch_size)
        tokens, forwards = sum(sum(s.tokens) for s in stats), sum(sum(s.nfe) for s in stats)
        same = sum(a == b for a, b in zip(out, ntp_out))
        print(f"  adaptive={adaptive!s:5}: {tokens / forwards:.2f} tokens per forward on "
              f"{len(problems)} test problems (output identical to NTP's on {same})")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    test_prompts = [task.encode_prompt(p) for p, _ in problems[:unfamiliar_prompts]]
    cases = [("test problems", model, test_prompts)]
    if hasattr(model, "transformer"):  # the demo GPT: character prompts and a random twin
        shape = dict(n_layer=model.config.n_layer, n_head=model.config.n_head,
                     n_embd=model.config.n_embd, block_size=model.config.block_size,
                     vocab_size=model.config.vocab_size)
        cases += [("prompts unlike training's", model, unfamiliar(task, unfamiliar_prompts, rng)),
                  ("a random model, same shape", build_model("gpt", **shape).to(device).eval(),
                   test_prompts)]
    for name, m, prompts in cases:
        decode(m, torch.tensor([prompts[0]], device=device), exact, 4)  # warm-up
        ntp_s, _, _ = timed(m, prompts, exact, task.max_new_tokens, ntp=True)
        line = f"  {name} ({len(prompts)}, batch 1): NTP {ntp_s:.2f} s"
        for adaptive in (False, True):
            s, tokens, forwards = timed(m, prompts, exact.replace(adaptive=adaptive),
                                        task.max_new_tokens)
            line += (f"; exact adaptive={adaptive}: {s:.2f} s = {ntp_s / s:.2f}x NTP's speed, "
                     f"{tokens / forwards:.2f} tok/fwd")
        print(line)


def roofline_shape(model):
    """The model's shapes in roofline.model_time's terms."""
    c = model.config
    if hasattr(model, "transformer"):
        return roofline.gpt_shape(c.n_layer, c.n_head, c.n_embd, c.vocab_size)
    return dict(dim=c.dim, n_layers=c.n_layers, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
                head_dim=c.head_dim, ffn=c.ffn_hidden, ffn_matrices=3, vocab=c.vocab_size)


def cpu_hardware(model):
    """This CPU as roofline.py's hardware: peak flop/s and bandwidth measured (or given) in the
    model's dtype."""
    dtype = next(model.parameters()).dtype
    peak = peak_gflops * 1e9 or measure_peak(dtype)
    nbytes = dtype.itemsize * sum(p.numel() for p in model.parameters())
    bandwidth = bandwidth_gbs * 1e9 or measure_bandwidth(nbytes)
    return dict(peak=peak, attention=peak, bandwidth=bandwidth, weight_bytes=dtype.itemsize,
                kv_bytes=dtype.itemsize)


def batch_setup(n_problems):
    """-> (model, n_problems problems, plain settings or None, exact settings, task, path) for
    out_dir's checkpoint: the demo's test problems, or a chat model's benchmark problems."""
    from pretrained.loading import tokenizer_of

    path = os.path.join(out_dir, "ckpt_sbd.pt")
    model, checkpoint = load_checkpoint(path, device)
    model = model.to(getattr(torch, resolve_dtype(decode_dtype, device)))
    tokenizer = (tokenizer_of(checkpoint["tokenizer"]) if checkpoint["model_family"] == "llama"
                 else None)
    task = task_of_checkpoint(checkpoint, path, tokenizer)
    problems = (task.splits.get("test") or task.splits["val"])[:n_problems]
    calibration = read_calibration(path, checkpoint)
    exact = settings_for(checkpoint, calibration, k=k or None, exact=True)
    try:
        plain = settings_for(checkpoint, calibration, k=exact.k, gamma=gamma)
    except ConfigError as e:
        print(f"plain SBD not measured: {e}")
        plain = None
    return model, problems, plain, exact, task, path


def decode_problems(model, task, problems, settings, batch_size, ntp=False):
    """Every problem decoded as evaluate.py decodes them -> (output ids in problem order,
    [DecodeStats per batch])."""
    from tasks.solve import decode_batches

    outputs, all_stats = [None] * len(problems), []
    for indices, out, stats in decode_batches(model, task, problems, settings, batch_size, ntp):
        for i, ids in zip(indices, out):
            outputs[i] = ids
        all_stats.append(stats)
    return outputs, all_stats


def bench_batch():
    """Tokens per second of NTP, plain SBD and exact SBD against batch size, measured side by side,
    and what the roofline of this CPU predicts from the forwards each decode fed (widths)."""
    model, problems, plain, exact, task, path = batch_setup(batch_problems)
    modes = {"NTP": (exact, True), "exact SBD": (exact, False)}
    if plain:
        modes["SBD"] = (plain, False)
    hw, shape = cpu_hardware(model), roofline_shape(model)
    n_prompt = len(task.encode_prompt(problems[0][0]))
    kv = n_prompt + task.max_new_tokens // 2  # a mid-answer context for the roofline
    t1 = forward_time(model, *filled_cache(model, kv), 1)  # what the roofline leaves out: overhead
    overhead = t1 - roofline.model_time(1, kv, 1, hw, shape)
    print(f"{path}: {len(problems)} problems at each batch size; {cpu_name()}, "
          f"{torch.get_num_threads()} threads, {next(model.parameters()).dtype}; roofline: "
          f"{hw['peak'] / 1e9:.0f} GFLOP/s, {hw['bandwidth'] / 1e9:.0f} GB/s, plus "
          f"{1000 * overhead:.2f} ms per forward")
    print(f"{'batch':>5} "
          + " ".join(f"{m + ' tok/s':>14} {'x NTP':>6} {'pred.':>6}" for m in modes)
          + f" {'tok/fwd per row':>16}")
    table, outputs = {}, {}
    for B in batch_sizes:
        cells, per_row = {}, {}
        for mode, (settings, ntp) in modes.items():
            tokens, seconds, forwards, predicted = 0, 0.0, 0, 0.0
            outputs[mode, B], all_stats = decode_problems(model, task, problems, settings, B, ntp)
            for stats in all_stats:
                tokens, seconds = tokens + sum(stats.tokens), seconds + stats.wall_time
                forwards += sum(stats.nfe)
                predicted += sum(overhead + roofline.model_time(w, kv, len(stats.tokens), hw, shape)
                                 for w in stats.widths)
            cells[mode] = (tokens / seconds, tokens / predicted)
            per_row[mode] = tokens / forwards
        ntp_rate, ntp_pred = cells["NTP"]
        table[B] = cells
        print(f"{B:5d} " + " ".join(f"{rate:14.0f} {rate / ntp_rate:5.2f}x {pred / ntp_pred:5.2f}x"
                                    for rate, pred in cells.values())
              + "  " + ", ".join(f"{m} {v:.2f}" for m, v in per_row.items() if m != "NTP"))
    for mode in (m for m in modes if m != "NTP"):
        slower = [B for B in batch_sizes if table[B][mode][0] <= table[B]["NTP"][0]]
        where = f"from batch {slower[0]} on" if slower else f"at none of {list(batch_sizes)}"
        print(f"{mode} stops paying (no more tokens/s than NTP) {where}")
    alone = outputs["NTP", min(batch_sizes)]  # NTP, each row as alone as the sizes go
    for B in batch_sizes:
        same = sum(a == b for a, b in zip(outputs["exact SBD", B], alone))
        print(f"exact SBD at batch {B}: output identical to NTP at batch {min(batch_sizes)} on "
              f"{same} of {len(problems)} problems")
    plot_batch(table, os.path.join(out_dir, "batch.png"))


def plot_batch(table, path):
    """Tokens per second against batch size per mode (measured, solid; roofline, dashed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib to get this table as a picture)")
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    sizes = sorted(table)
    for mode in table[sizes[0]]:
        line, = ax.plot(sizes, [table[B][mode][0] for B in sizes], "o-", label=f"{mode}, measured")
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


@torch.inference_mode()
def filled_cache(model, n):
    """(a KV cache holding n tokens, nothing else)."""
    cache = model.new_cache(1, n + 40, device, dtype=next(model.parameters()).dtype)
    model(torch.zeros(1, n, dtype=torch.long, device=device), cache=cache)
    return (cache,)


def best_time(fn, n):
    """The fastest of n calls of fn() after one warm-up: a ceiling is what the machine can do
    undisturbed."""
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


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


@torch.inference_mode()
def block_forward_times(model, kv):
    """{k: seconds of one k-token forward on a KV cache of kv tokens}, batch 1, k in roofline_ks:
    the fastest round's median (another job on the core only ever slows a round down).

    k = 1 is an NTP step (no mask, as generate.ntp_generate); k > 1 is an SBD block that attends to
    the cache and to itself (sbd.hybrid_mask), its keys written into the cache's spare slots (a
    view, no copy) and dropped after (cache.length reset).
    """
    cache = model.new_cache(1, kv + max(roofline_ks), device)
    vocab = model.lm_head.weight.size(0)
    model(torch.randint(0, vocab, (1, kv), device=device), cache=cache)  # the prefix
    tokens = torch.randint(0, vocab, (1, max(roofline_ks)), device=device)
    masks = {k: None if k == 1 else dense_mask(lambda q, key: hybrid_mask(q, key, kv), k, kv + k,
                                               query_offset=kv, device=device) for k in roofline_ks}
    rounds = {k: [] for k in roofline_ks}
    for _ in range(roofline_rounds):
        for k in roofline_ks:
            times = []
            for _ in range(roofline_reps + 2):  # + 2 warm-up
                t0 = time.perf_counter()
                model(tokens[:, :k], mask=masks[k], cache=cache)
                times.append(time.perf_counter() - t0)
                cache.length = kv
            rounds[k].append(statistics.median(times[2:]))
    return {k: min(v) for k, v in rounds.items()}


def cpu_name():
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def roofline_vs_measured(name, shape, peak):
    """One random GPT: measured t(k) next to the roofline and to the fit overhead + roofline(k)."""
    torch.manual_seed(seed)
    model = build_model("gpt", **shape).to(device).eval()
    weight_bytes = 4 * sum(p.numel() for p in model.parameters())
    bandwidth = bandwidth_gbs * 1e9 or measure_bandwidth(weight_bytes)
    hw = dict(peak=peak, attention=peak, bandwidth=bandwidth,
              weight_bytes=4, kv_bytes=4)  # fp32 throughout
    arch = roofline.gpt_shape(shape["n_layer"], shape["n_head"], shape["n_embd"],
                              shape["vocab_size"])
    measured = block_forward_times(model, roofline_kv)
    predicted = {k: roofline.model_time(k, roofline_kv, 1, hw, arch) for k in roofline_ks}
    lsq = roofline.fit_overhead([measured[k] for k in roofline_ks],
                                [predicted[k] for k in roofline_ks])
    at_1 = measured[1] - predicted[1]  # the simpler fit: t(1) = overhead + roofline(1) exactly
    fits = {"least squares": {k: lsq + predicted[k] for k in roofline_ks},
            "fit at k=1": {k: at_1 + predicted[k] for k in roofline_ks}}
    print(f"\n{name}: {weight_bytes / 1e6:.1f} MB of weights, bandwidth {bandwidth / 1e9:.0f} GB/s "
          f"({'given' if bandwidth_gbs else 'measured: best copy of a buffer that size'})")
    print(f"{'':>33}roofline     overhead + roofline(k), t(k)/t(1) and its error")
    print(f"{'k':>4} {'measured ms':>12} {'t(k)/t(1)':>10} | {'ms':>7} {'ratio':>6} | "
          + " | ".join(f"{fit:>20}" for fit in fits))
    for k in roofline_ks:
        ratio = measured[k] / measured[1]
        print(f"{k:4d} {1000 * measured[k]:12.3f} {ratio:10.2f} | {1000 * predicted[k]:7.3f} "
              f"{predicted[k] / predicted[1]:6.2f} | "
              + " | ".join(f"{t[k] / t[1]:12.2f} {t[k] / t[1] / ratio - 1:+7.0%}"
                           for t in fits.values()))
    k = 16 if 16 in roofline_ks else max(roofline_ks)
    print(f"fitted overhead: {1000 * lsq:.3f} ms "
          f"(least squares over k: the mean of t(k) - roofline(k)), "
          f"{1000 * at_1:.3f} ms (at k=1); "
          f"the roofline alone is {predicted[1] / measured[1]:.0%} of t(1)")
    print(f"t({k})/t(1): measured {measured[k] / measured[1]:.2f}, "
          f"roofline alone {predicted[k] / predicted[1]:.2f}, "
          + ", ".join(f"{fit} {t[k] / t[1]:.2f} "
                      f"({t[k] / t[1] / (measured[k] / measured[1]) - 1:+.0%})"
                      for fit, t in fits.items()) + "; goal: within 25%")
    k0, k1 = sorted(roofline_ks)[-2:]  # one more token's cost, measured between the two largest k
    per_token = (measured[k1] - measured[k0]) / (k1 - k0)
    flops = (roofline.model_flops(k1, roofline_kv, 1, arch)
             - roofline.model_flops(k0, roofline_kv, 1, arch))
    flops /= k1 - k0
    print(f"one more token (k={k0}..{k1}): {1e6 * per_token:.1f} us for {flops / 1e6:.2f} MFLOP = "
          f"{flops / per_token / 1e9:.0f} GFLOP/s, "
          f"{flops / per_token / peak:.0%} of the matmul peak "
          "(the roofline prices it at 100%)")


def bench_roofline():
    peak = peak_gflops * 1e9 or measure_peak()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, fp32: peak {peak / 1e9:.0f} GFLOP/s "
          f"({'given' if peak_gflops else 'measured: best 512x512 matmul'}); "
          f"batch 1, KV cache of {roofline_kv} tokens; each time is the fastest of "
          f"{roofline_rounds} rounds' medians of {roofline_reps} forwards")
    models = [("demo GPT 4L/4h/128d, vocab 32 (config/sbd_small.py)",
               dict(n_layer=4, n_head=4, n_embd=128, vocab_size=32, block_size=73)),
              (f"GPT {n_layer}L/{n_head}h/{n_embd}d, vocab {vocab_size}",
               dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
                    block_size=block_size))]
    for name, shape in models:
        if roofline_kv + max(roofline_ks) > shape["block_size"]:
            raise ConfigError(f"{name}: KV {roofline_kv} + {max(roofline_ks)} tokens is past its "
                             f"context of {shape['block_size']}: "
                             f"lower --roofline_kv or --roofline_ks")
        roofline_vs_measured(name, shape, peak)


if __name__ == "__main__":
    if threads:
        torch.set_num_threads(threads)
    benches = {"kvcache": bench_kvcache, "sbd": bench_sbd, "batch": bench_batch,
               "adaptive": bench_adaptive, "roofline": bench_roofline}
    if what not in benches:
        raise ConfigError(f"what must be one of {', '.join(benches)}, got {what!r}")
    benches[what]()
