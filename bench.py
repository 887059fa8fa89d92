"""
Decoding benchmarks, measured side by side in one run (timings to read, not a pass/fail test).

    python bench.py --what=kvcache   # NTP with the KV cache vs recomputing the whole context every step
    python bench.py --what=sbd       # SBD vs NTP decoding: measured, and as Eq. 16 predicts from forward times
    python bench.py --what=roofline  # a k-token forward on a KV cache, measured next to roofline.py's prediction

kvcache: a 6-layer, 384-wide GPT decodes new_tokens tokens greedily twice: through the KV cache
(sbd.ntp_generate) and the way nanoGPT's sampler does it, one full forward over the whole context per token.
sbd: the same model and prompts decoded with NTP and with SBD, both through the KV cache, batch 1. Uses
out_dir/ckpt_sbd.pt if it exists (prompts from its task's test split), else a random model. Besides the
measured speed-ups it times a 1-, k- and 2k-token forward on top of a cache and predicts SBD's wall clock
from the forward counts (Eq. 16 of the paper, generalised to the measured counts): measured / predicted
near 1 means the sampler's own work per forward is small next to the model's.
roofline: the time of a k-token forward on a KV cache (k = 1, 2, ..., 32, batch 1) for two random GPTs, the
demo's shape and the 11M model above, next to roofline.py's max(flops/peak, bytes/bandwidth) for this CPU
(peak and bandwidth measured here, or given) and two fits of t(k) = overhead + roofline(k): least squares over
k, and exact at k=1. On a CPU these tiny models are bound by per-call overhead, not by flops or bytes: the
fitted overhead says by how much, and the cost of one more token says how far the roofline's price is off.
"""

import os
import statistics
import sys
import time

import torch

import roofline
import sbd
from configurator import configure
from model import build_model, dense_mask, load_checkpoint

# -----------------------------------------------------------------------------
what = "sbd"  # 'kvcache', 'sbd' or 'roofline'
device = "cpu"  # this is a CPU benchmark; timings on an accelerator would need more care
seed = 1337
threads = 0  # torch threads; 0 = torch's default. Never time while another torch job runs (FINDINGS.md)
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
gamma = None  # None = what evaluate.py calibrated for that k (γ_low, and the exact mode's), or random_gamma
random_gamma = 16.0  # a random model predicts near-uniformly (H ~ log 256 = 5.5): γ = 16 reveals ~3 per forward
rule = "entropy"
num_prompts = 4  # decoded one at a time (batch 1, the setting of Eq. 16)
max_new_tokens = 256
timing_repeats = 30  # forwards per timing of a 1-, k- and 2k-token forward
# roofline (the demo's shape and the random model above)
roofline_ks = (1, 2, 4, 8, 16, 32)  # tokens per forward
roofline_kv = 40  # tokens in the KV cache: mid-answer in the demo (13-token prompt, answers of ~59 tokens)
roofline_rounds = 7  # rounds over every k, interleaved: the fastest round is reported (the others were disturbed)
roofline_reps = 10  # timed forwards per k and round (their median is the round's time)
peak_gflops = 0.0  # this CPU's peak flop rate in GFLOP/s; 0 = measure it (best of 20 fp32 512x512 matmuls)
bandwidth_gbs = 0.0  # its memory bandwidth in GB/s; 0 = measure it per model (a copy the size of its weights)
configure(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------


@torch.inference_mode()
def recompute_generate(model, prompt, max_new_tokens):
    """Greedy NTP without a cache, as nanoGPT's sampler: a full forward over the whole context per token."""
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
    sbd.ntp_generate(model, prompt, 8)  # warm-up
    cached, stats = sbd.ntp_generate(model, prompt, new_tokens)
    t0 = time.perf_counter()
    recomputed = recompute_generate(model, prompt, new_tokens)
    t_recompute = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"GPT {n_layer}L/{n_embd}d ({params:.1f}M parameters), greedy, prompt {prompt_len}, {new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads")
    print(f"KV cache:   {stats.wall_time:7.2f} s  {new_tokens / stats.wall_time:7.1f} tokens/s")
    print(f"recompute:  {t_recompute:7.2f} s  {new_tokens / t_recompute:7.1f} tokens/s")
    print(f"speed-up of the KV cache: {t_recompute / stats.wall_time:.1f}x "
          f"(same tokens: {cached[0] == recomputed[0].tolist()})")


def sbd_setup():
    """-> (model, prompts [(1, T0) tensors], mask_id, stop_ids, k, γ, exact γ, max_new, description).

    With a trained checkpoint, k and both γ come from what evaluate.py calibrated for that k, unless given:
    a γ only means something for the block size it was calibrated with."""
    path = os.path.join(out_dir, "ckpt_sbd.pt")
    if not os.path.exists(path):
        torch.manual_seed(seed)
        model = build_model("gpt", n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                            vocab_size=vocab_size).to(device).eval()
        prompts = [torch.randint(0, vocab_size - 1, (1, prompt_len), device=device) for _ in range(num_prompts)]
        g = gamma if gamma is not None else random_gamma
        print(f"no {path}: a random GPT {n_layer}L/{n_embd}d, k={k or 16}, γ={g:g} (random_gamma unless given)")
        return model, prompts, vocab_size - 1, [], k or 16, g, g, max_new_tokens, f"random GPT {n_layer}L/{n_embd}d"
    from task import task_of_checkpoint  # only a trained model comes with a task
    model, checkpoint = load_checkpoint(path, device)
    info, task = checkpoint["sbd"], task_of_checkpoint(checkpoint, path)
    prompts = [torch.tensor([task.encode(p)], device=device) for p, _ in task.splits["test"][:num_prompts]]
    kk = k or info.get("k") or 16
    low = info.get("gammas", {}).get(str(kk), [info.get("gamma_low")])[0]
    exact = info.get("gamma_exact", {}).get(str(kk))
    g = gamma if gamma is not None else low
    g_exact = gamma if gamma is not None else exact
    if g_exact is None:
        raise SystemExit(f"{path} has no calibrated γ for k={kk} (γ_low {low}, exact {exact}): run evaluate.py, "
                         f"or give --gamma")
    where = "given" if gamma is not None else f"calibrated for k={kk} by evaluate.py"
    low_text = f"γ_low={g:g}" if g is not None else "no γ_low (no γ kept plain SBD within its budget on val)"
    print(f"{path}: k={kk} ({'given' if k else 'the checkpoint operating point'}), {low_text} and exact γ="
          f"{g_exact:g} ({where})")
    return model, prompts, info["mask_id"], info["stop_ids"], kk, g, g_exact, task.max_new_tokens, path


@torch.inference_mode()
def forward_time(model, cache, n_prev, kb):
    """Median seconds of one block_forward of [n_prev committed ; kb block] tokens on top of cache.

    kb = 0 times a plain 1-token NTP step (n_prev = 1). The cache is restored after each forward.
    """
    L, times = cache.length, []
    prev = torch.zeros(1, n_prev, dtype=torch.long, device=device)
    block = torch.zeros(1, kb, dtype=torch.long, device=device)
    for _ in range(timing_repeats + 3):
        t0 = time.perf_counter()
        if kb == 0:
            model(prev, cache=cache)
        else:
            sbd.block_forward(model, cache, prev, block)
        times.append(time.perf_counter() - t0)
        cache.length = L
    return statistics.median(times[3:])  # the first few are warm-up


def forward_widths(stats):
    """[forwards that fed about k tokens, forwards that fed about 2k] of one batch-1 SBD decode. A forward that
    commits the previous block feeds it too (2k); the others feed the block alone (k). Counted as k: the first
    forward of a decode (1 + k tokens), the exact mode's commits of a lone corrected token (1 + k) and its final
    check that passes (the last block alone); a check that rejects counts as 2k (it ran a block, unless final)."""
    wide = 0
    for i, step in enumerate(stats.steps):
        if stats.accepted is None:  # plain SBD: a block's first forward commits the block before it
            wide += i > 0 and step.block_start != stats.steps[i - 1].block_start
        else:  # exact SBD: every forward that checks drafts commits them
            drafts = step.check is not None and (step.check.kept or step.check.rejected)
            wide += bool(drafts) and (step.tokens.size(1) > 0 or step.check.correction is not None)
    return [len(stats.steps) - wide, wide]


def n_blocks(stats):
    """Blocks a batch-1 SBD decode started (exact mode: not counting blocks thrown away unseen)."""
    if stats.accepted is None:
        return len({step.block_start for step in stats.steps})
    return sum(step.check is not None and step.tokens.size(1) > 0 for step in stats.steps)


def bench_sbd():
    model, prompts, mask_id, stop_ids, kk, g, g_exact, max_new, description = sbd_setup()
    modes = ["ntp", "sbd", "exact"] if g is not None else ["ntp", "exact"]  # plain SBD only if it has a γ
    stats = {mode: [] for mode in modes}
    sbd.sbd_generate(model, prompts[0], kk, g_exact, rule, mask_id, 4)  # warm-up
    for prompt in prompts:  # interleave the modes, so that a slow moment of the machine hits them alike
        stats["ntp"].append(sbd.ntp_generate(model, prompt, max_new, stop_ids, mask_id=mask_id)[1])
        if g is not None:
            stats["sbd"].append(sbd.sbd_generate(model, prompt, kk, g, rule, mask_id, max_new, stop_ids,
                                                 record_steps=True)[1])
        stats["exact"].append(sbd.sbd_generate(model, prompt, kk, g_exact, rule, mask_id, max_new, stop_ids,
                                               record_steps=True, verify=True)[1])
    decode_time = {mode: sum(s.wall_time - s.prefill_time for s in st) for mode, st in stats.items()}
    n_tokens = {mode: sum(s.tokens[0] for s in st) for mode, st in stats.items()}
    nfe = {mode: sum(s.nfe[0] for s in st) for mode, st in stats.items()}

    # forward times on a cache as long as the average decoding context
    T0 = prompts[0].size(1)
    cache = model.new_cache(1, T0 + max_new + 2 * kk, device)
    context = min(T0 + n_tokens["ntp"] // (2 * len(prompts)), model.max_seq_len - 2 * kk)
    model(torch.zeros(1, context, dtype=torch.long, device=device), cache=cache)
    t = {"1": forward_time(model, cache, 1, 0), "k": forward_time(model, cache, 0, kk),
         "2k": forward_time(model, cache, kk, kk)}
    print(f"{description}, {len(prompts)} prompts decoded one at a time, greedy, {torch.get_num_threads()} threads")
    print(f"forward times on a cache of {context}: t(1) = {1000 * t['1']:.2f} ms, t({kk}) = {1000 * t['k']:.2f} ms,"
          f" t({2 * kk}) = {1000 * t['2k']:.2f} ms; t({kk})/t(1) = {t['k'] / t['1']:.2f}")
    roof = cpu_roofline_times(model, context, (1, kk, 2 * kk), t["1"])
    if roof:
        print(f"    roofline of this CPU + the per-call overhead t(1) leaves ({1000 * (t['1'] - roof['bare'][1]):.2f} ms):"
              f" t({kk})/t(1) = {roof[kk] / roof[1]:.2f}, t({2 * kk})/t(1) = {roof[2 * kk] / roof[1]:.2f} "
              f"(measured {t['k'] / t['1']:.2f}, {t['2k'] / t['1']:.2f}; the roofline alone "
              f"{roof['bare'][kk] / roof['bare'][1]:.2f}, {roof['bare'][2 * kk] / roof['bare'][1]:.2f})")
    print(f"NTP: {n_tokens['ntp']} tokens in {nfe['ntp']} forwards, decode {decode_time['ntp']:.2f} s "
          f"({1000 * decode_time['ntp'] / n_tokens['ntp']:.2f} ms/token)")
    ntp_per_token = decode_time["ntp"] / n_tokens["ntp"]
    if g is None:
        print(f"SBD k={kk}: not timed, no γ kept it within its accuracy budget on val (--gamma times it anyway)")
    names = {"sbd": f"SBD k={kk} γ={g if g is not None else 0:g}", "exact": f"exact SBD k={kk} γ={g_exact:g}"}
    for mode in [m for m in ("sbd", "exact") if m in stats]:
        name = names[mode]
        widths = [sum(c) for c in zip(*(forward_widths(s) for s in stats[mode]))]
        predicted = (widths[0] * t["k"] + widths[1] * t["2k"]) / n_tokens[mode]  # seconds per token
        measured = decode_time[mode] / n_tokens[mode]
        l = nfe[mode] / sum(n_blocks(s) for s in stats[mode])  # forwards per block
        checked = (f", {sum(s.accepted[0] for s in stats[mode])} drafts kept, "
                   f"{sum(s.rejected[0] for s in stats[mode])} rejected, "
                   f"{sum(s.final_checks[0] for s in stats[mode])} final checks") if mode == "exact" else ""
        print(f"{name}: {n_tokens[mode]} tokens in {nfe[mode]} forwards ({n_tokens[mode] / nfe[mode]:.2f} tok/fwd, "
              f"l = {l:.2f} forwards per block{checked}), decode {decode_time[mode]:.2f} s "
              f"({1000 * measured:.2f} ms/token)")
        eq16 = kk * t["1"] / (t["2k"] + (l - 1) * t["k"])
        if roof:
            eq16 = f"{eq16:.2f}x; with the roofline's times {kk * roof[1] / (roof[2 * kk] + (l - 1) * roof[kk]):.2f}x"
        else:
            eq16 = f"{eq16:.2f}x"
        print(f"    NFE speed-up {(nfe['ntp'] / n_tokens['ntp']) / (nfe[mode] / n_tokens[mode]):.2f}x; wall clock vs "
              f"NTP: measured {ntp_per_token / measured:.2f}x, predicted from the forward times "
              f"{t['1'] / predicted:.2f}x (Eq. 16 with l = {l:.2f}: {eq16}); measured / predicted = "
              f"{(ntp_per_token / measured) / (t['1'] / predicted):.2f} (goal >= 0.8); time beyond the forwards: "
              f"{1000 * (decode_time[mode] - predicted * n_tokens[mode]) / nfe[mode]:.2f} ms per forward")
    same = all(a.tokens == b.tokens for a, b in zip(stats["ntp"], stats["exact"]))
    print(f"exact SBD output == NTP output on every prompt: {same}")


def cpu_roofline_times(model, kv, ks, t1):
    """{k: overhead + roofline(k)} for a GPT on this CPU (measured peak and bandwidth, fp32), the overhead being
    what a measured 1-token forward t1 spends beyond its roofline; 'bare': the roofline alone. None for a Llama."""
    if not hasattr(model, "transformer"):
        return None
    c = model.config
    peak = peak_gflops * 1e9 or measure_peak()
    bandwidth = bandwidth_gbs * 1e9 or measure_bandwidth(4 * sum(p.numel() for p in model.parameters()))
    hw = dict(peak=peak, attention=peak, bandwidth=bandwidth, weight_bytes=4, kv_bytes=4)
    shape = roofline.gpt_shape(c.n_layer, c.n_head, c.n_embd, c.vocab_size)
    bare = {k: roofline.model_time(k, kv, 1, hw, shape) for k in ks}
    return {**{k: t1 - bare[1] + bare[k] for k in ks}, "bare": bare}


def best_time(fn, n):
    """The fastest of n calls of fn() after one warm-up: a ceiling is what the machine can do undisturbed."""
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_peak():
    """This CPU's peak flop/s at torch's thread count: the best of 20 fp32 512x512 matmuls (2·512³ flops)."""
    a = torch.randn(512, 512)
    return 2 * 512 ** 3 / best_time(lambda: a @ a, 20)


def measure_bandwidth(nbytes):
    """Bytes/s of copying a buffer of nbytes (bytes read + bytes written, as STREAM's copy), best of 20. Sized
    like a model's weights, it measures the memory level that holds them: the last-level cache for the demo's
    3 MB (weights stay there between forwards), DRAM for the 11M model's 45 MB."""
    x = torch.randn(nbytes // 4)
    y = torch.empty_like(x)
    return 2 * x.nbytes / best_time(lambda: y.copy_(x), 20)


@torch.inference_mode()
def block_forward_times(model, kv):
    """{k: seconds of one k-token forward on a KV cache of kv tokens}, batch 1, k in roofline_ks: the fastest
    round's median (another job on the core only ever slows a round down).

    k = 1 is an NTP step (no mask, as sbd.ntp_generate); k > 1 is an SBD block that attends to the cache and
    to itself (sbd.hybrid_mask), its keys written into the cache's spare slots (a view, no copy) and dropped
    after (cache.length reset).
    """
    cache = model.new_cache(1, kv + max(roofline_ks), device)
    vocab = model.lm_head.weight.size(0)
    model(torch.randint(0, vocab, (1, kv), device=device), cache=cache)  # the prefix
    tokens = torch.randint(0, vocab, (1, max(roofline_ks)), device=device)
    masks = {k: None if k == 1 else dense_mask(lambda q, key: sbd.hybrid_mask(q, key, kv), k, kv + k,
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
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def roofline_vs_measured(name, shape, peak):
    """One random GPT: measured t(k) next to the roofline and to the fit overhead + roofline(k)."""
    torch.manual_seed(seed)
    model = build_model("gpt", **shape).to(device).eval()
    weight_bytes = 4 * sum(p.numel() for p in model.parameters())
    bandwidth = bandwidth_gbs * 1e9 or measure_bandwidth(weight_bytes)
    hw = dict(peak=peak, attention=peak, bandwidth=bandwidth, weight_bytes=4, kv_bytes=4)  # fp32 throughout
    arch = roofline.gpt_shape(shape["n_layer"], shape["n_head"], shape["n_embd"], shape["vocab_size"])
    measured = block_forward_times(model, roofline_kv)
    predicted = {k: roofline.model_time(k, roofline_kv, 1, hw, arch) for k in roofline_ks}
    lsq = roofline.fit_overhead([measured[k] for k in roofline_ks], [predicted[k] for k in roofline_ks])
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
              + " | ".join(f"{t[k] / t[1]:12.2f} {t[k] / t[1] / ratio - 1:+7.0%}" for t in fits.values()))
    k = 16 if 16 in roofline_ks else max(roofline_ks)
    print(f"fitted overhead: {1000 * lsq:.3f} ms (least squares over k: the mean of t(k) - roofline(k)), "
          f"{1000 * at_1:.3f} ms (at k=1); the roofline alone is {predicted[1] / measured[1]:.0%} of t(1)")
    print(f"t({k})/t(1): measured {measured[k] / measured[1]:.2f}, roofline alone {predicted[k] / predicted[1]:.2f}, "
          + ", ".join(f"{fit} {t[k] / t[1]:.2f} ({t[k] / t[1] / (measured[k] / measured[1]) - 1:+.0%})"
                      for fit, t in fits.items()) + "; goal: within 25%")
    k0, k1 = sorted(roofline_ks)[-2:]  # what one more token costs, measured between the two largest k
    per_token = (measured[k1] - measured[k0]) / (k1 - k0)
    flops = roofline.model_flops(k1, roofline_kv, 1, arch) - roofline.model_flops(k0, roofline_kv, 1, arch)
    flops /= k1 - k0
    print(f"one more token (k={k0}..{k1}): {1e6 * per_token:.1f} us for {flops / 1e6:.2f} MFLOP = "
          f"{flops / per_token / 1e9:.0f} GFLOP/s, {flops / per_token / peak:.0%} of the matmul peak "
          "(the roofline prices it at 100%)")


def bench_roofline():
    peak = peak_gflops * 1e9 or measure_peak()
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, fp32: peak {peak / 1e9:.0f} GFLOP/s "
          f"({'given' if peak_gflops else 'measured: best 512x512 matmul'}); batch 1, KV cache of {roofline_kv} "
          f"tokens; each time is the fastest of {roofline_rounds} rounds' medians of {roofline_reps} forwards")
    models = [("demo GPT 4L/4h/128d, vocab 32 (config/sbd_small.py)",
               dict(n_layer=4, n_head=4, n_embd=128, vocab_size=32, block_size=73)),
              (f"GPT {n_layer}L/{n_head}h/{n_embd}d, vocab {vocab_size}",
               dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size, block_size=block_size))]
    for name, shape in models:
        if roofline_kv + max(roofline_ks) > shape["block_size"]:
            raise SystemExit(f"{name}: KV {roofline_kv} + {max(roofline_ks)} tokens is past its context of "
                             f"{shape['block_size']}: lower --roofline_kv or --roofline_ks")
        roofline_vs_measured(name, shape, peak)


if __name__ == "__main__":
    if threads:
        torch.set_num_threads(threads)
    benches = {"kvcache": bench_kvcache, "sbd": bench_sbd, "roofline": bench_roofline}
    if what not in benches:
        raise SystemExit(f"what must be one of {', '.join(benches)}, got {what!r}")
    benches[what]()
