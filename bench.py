"""
Decoding benchmarks, measured side by side in one run (timings to read, not a pass/fail test).

    python bench.py --what=kvcache   # NTP with the KV cache vs recomputing the whole context every step
    python bench.py --what=sbd       # SBD vs NTP decoding: measured, and as Eq. 16 predicts from forward times

kvcache: a 6-layer, 384-wide GPT decodes new_tokens tokens greedily twice: through the KV cache
(sbd.ntp_generate) and the way nanoGPT's sampler does it, one full forward over the whole context per token.
sbd: the same model and prompts decoded with NTP and with SBD, both through the KV cache, batch 1. Uses
out_dir/ckpt_sbd.pt if it exists (prompts from its task's test split), else a random model. Besides the
measured speed-ups it times a 1-, k- and 2k-token forward on top of a cache and predicts SBD's wall clock
from the forward counts (Eq. 16 of the paper, generalised to the measured counts): measured / predicted
near 1 means the sampler's own work per forward is small next to the model's.
"""

import os
import statistics
import sys
import time

import torch

import sbd
from configurator import configure
from model import build_model, load_checkpoint

# -----------------------------------------------------------------------------
what = "sbd"  # 'kvcache' or 'sbd'
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
k = 16
gamma = None  # None = the checkpoint's gamma_low, or random_gamma for a random model
random_gamma = 16.0  # a random model predicts near-uniformly (H ~ log 256 = 5.5): γ = 16 reveals ~3 per forward
rule = "entropy"
num_prompts = 4  # decoded one at a time (batch 1, the setting of Eq. 16)
max_new_tokens = 256
timing_repeats = 30  # forwards per timing of a 1-, k- and 2k-token forward
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
    """-> (model, prompts [(1, T0) tensors], mask_id, stop_ids, gamma, max_new, description)."""
    path = os.path.join(out_dir, "ckpt_sbd.pt")
    if os.path.exists(path):
        from task import CharTask  # only a trained model comes with a task
        model, checkpoint = load_checkpoint(path, device)
        info, task = checkpoint["sbd"], CharTask(checkpoint["dataset"])
        prompts = [torch.tensor([task.encode(p)], device=device) for p, _ in task.splits["test"][:num_prompts]]
        g = gamma if gamma is not None else (info.get("gamma_low") or 0.01)
        return model, prompts, info["mask_id"], info["stop_ids"], g, task.seq_len - task.prompt_len, path
    torch.manual_seed(seed)
    model = build_model("gpt", n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                        vocab_size=vocab_size).to(device).eval()
    prompts = [torch.randint(0, vocab_size - 1, (1, prompt_len), device=device) for _ in range(num_prompts)]
    g = gamma if gamma is not None else random_gamma
    return model, prompts, vocab_size - 1, [], g, max_new_tokens, f"random GPT {n_layer}L/{n_embd}d"


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


def count_forwards(stats):
    """SBD forwards of batch-1 decodes by their width: (first forward of the first block, first forwards of
    later blocks (2k tokens in), later forwards (k tokens in))."""
    first_of_block = len({s.block_start for s in stats.steps})
    return 1, first_of_block - 1, len(stats.steps) - first_of_block


def bench_sbd():
    model, prompts, mask_id, stop_ids, g, max_new, description = sbd_setup()
    ntp_stats, sbd_stats = [], []
    sbd.sbd_generate(model, prompts[0], k, g, rule, mask_id, 4)  # warm-up
    for prompt in prompts:  # alternate the two, so that a slow moment of the machine hits both alike
        ntp_stats.append(sbd.ntp_generate(model, prompt, max_new, stop_ids, mask_id=mask_id)[1])
        sbd_stats.append(sbd.sbd_generate(model, prompt, k, g, rule, mask_id, max_new, stop_ids,
                                          record_steps=True)[1])
    decode_time = lambda stats: sum(s.wall_time - s.prefill_time for s in stats)
    n_tokens = lambda stats: sum(s.tokens[0] for s in stats)
    ntp_nfe, sbd_nfe = sum(s.nfe[0] for s in ntp_stats), sum(s.nfe[0] for s in sbd_stats)
    ntp_per_token = decode_time(ntp_stats) / n_tokens(ntp_stats)
    sbd_per_token = decode_time(sbd_stats) / n_tokens(sbd_stats)

    # forward times on a cache as long as the average decoding context
    T0 = prompts[0].size(1)
    cache = model.new_cache(1, T0 + max_new + 2 * k, device)
    context = min(T0 + n_tokens(sbd_stats) // (2 * len(prompts)), model.max_seq_len - 2 * k)
    model(torch.zeros(1, context, dtype=torch.long, device=device), cache=cache)
    t1, tk, t2k = forward_time(model, cache, 1, 0), forward_time(model, cache, 0, k), forward_time(model, cache, k, k)
    widths = [sum(c) for c in zip(*(count_forwards(s) for s in sbd_stats))]  # (1+k)-, 2k-, k-token forwards
    # the (1+k)-token first forward of a decode is timed as a k-token one
    predicted_ntp = ntp_nfe * t1 / n_tokens(ntp_stats)
    predicted_sbd = (widths[0] * tk + widths[1] * t2k + widths[2] * tk) / n_tokens(sbd_stats)
    blocks = widths[0] + widths[1]
    l = sbd_nfe / blocks  # forwards per block
    eq16 = k * t1 / (t2k + (l - 1) * tk)

    print(f"{description}, {len(prompts)} prompts decoded one at a time, greedy, {torch.get_num_threads()} threads")
    print(f"NTP: {n_tokens(ntp_stats)} tokens in {ntp_nfe} forwards, decode {decode_time(ntp_stats):.2f} s "
          f"({1000 * ntp_per_token:.2f} ms/token)")
    print(f"SBD k={k} γ={g:g} {rule}: {n_tokens(sbd_stats)} tokens in {sbd_nfe} forwards "
          f"({n_tokens(sbd_stats) / sbd_nfe:.2f} tok/fwd, l = {l:.2f} forwards per block), "
          f"decode {decode_time(sbd_stats):.2f} s ({1000 * sbd_per_token:.2f} ms/token)")
    print(f"forward times on a cache of {context}: t(1) = {1000 * t1:.2f} ms, t({k}) = {1000 * tk:.2f} ms, "
          f"t({2 * k}) = {1000 * t2k:.2f} ms; t({k})/t(1) = {tk / t1:.2f}")
    nfe_speedup = (ntp_nfe / n_tokens(ntp_stats)) / (sbd_nfe / n_tokens(sbd_stats))
    measured, predicted = ntp_per_token / sbd_per_token, predicted_ntp / predicted_sbd
    print(f"NFE speed-up {nfe_speedup:.2f}x; wall-clock speed-up measured {measured:.2f}x, predicted from the "
          f"forward times {predicted:.2f}x (Eq. 16 with l = {l:.2f}: {eq16:.2f}x)")
    overhead = (decode_time(sbd_stats) - predicted_sbd * n_tokens(sbd_stats)) / sbd_nfe
    print(f"measured / predicted = {measured / predicted:.2f} (goal >= 0.8); SBD time beyond its forwards: "
          f"{1000 * overhead:.2f} ms per forward")


if __name__ == "__main__":
    if threads:
        torch.set_num_threads(threads)
    if what not in ("kvcache", "sbd"):
        raise SystemExit(f"what must be 'kvcache' or 'sbd', got {what!r}")
    bench_kvcache() if what == "kvcache" else bench_sbd()
