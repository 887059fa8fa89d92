"""
Decoding benchmarks, measured side by side in one run (timings to read, not a pass/fail test).

    python -m bench --what=kvcache   # NTP with the KV cache vs recomputing the context every step
    python -m bench --what=sbd       # SBD vs NTP: measured, and as Eq. 16 predicts from forwards
    python -m bench --what=roofline  # a k-token forward on a KV cache vs roofline.py's prediction
    python -m bench --what=batch     # tokens/s of NTP, SBD and exact SBD against batch size
    python -m bench --what=adaptive  # exact SBD with and without the adaptive block size
    python -m bench --what=profile   # where a decode forward's time goes (bench/profile.py)

kvcache: a 6-layer, 384-wide GPT decodes new_tokens tokens greedily twice: through the KV cache
(serving.batched.ntp_generate) and the way nanoGPT's sampler does it, one full forward over the
whole context per token.
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
sbd, batch and adaptive time every mode `repeats` times, interleaved, after a warm-up, and print the
median [min-max] of each time and of each ratio to NTP (taken per repetition): the range shows how
noisy the machine was. profile: sbd's workload, each decode forward split into the model, cache
updates, mask building, host syncs and the decoder's own bookkeeping (bench/profile.py).

This file is the command line: the settings below and which benchmark runs. The benchmarks live in
bench/decode_speed.py (kvcache, sbd, adaptive), bench/batch.py, bench/cpu_roofline.py; what they
decode in bench/workload.py, what they time with in bench/measure.py. Each takes the settings as
one record, cfg (cfg.seed, cfg.out_dir, ...).
"""

import sys
import types

import torch

from bench.batch import bench_batch
from bench.cpu_roofline import bench_roofline
from bench.decode_speed import bench_adaptive, bench_kvcache, bench_sbd
from bench.profile import bench_profile
from configurator import ConfigError, configure

BENCHMARKS = {"kvcache": bench_kvcache, "sbd": bench_sbd, "batch": bench_batch,
              "adaptive": bench_adaptive, "roofline": bench_roofline, "profile": bench_profile}

# -----------------------------------------------------------------------------
what = "sbd"  # 'kvcache', 'sbd', 'roofline', 'batch', 'adaptive' or 'profile'
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
repeats = 5  # sbd, batch, adaptive: timed repetitions of every mode, interleaved (median, range)
timing_repeats = 30  # forwards per timing of a 1-, k- and 2k-token forward (and batch's t(1))
# batch: throughput against batch size, on out_dir's checkpoint (the demo, or a chat model)
batch_sizes = (1, 4, 16, 64)
batch_problems = 128  # problems decoded at every batch size, in batches of that size
decode_dtype = "float32"  # out_dir's checkpoint in 'float32', 'bfloat16' or 'auto' (bf16 where
# the CPU computes it), in every benchmark that decodes it (sbd, batch, adaptive)
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
cfg = types.SimpleNamespace(**configure(globals(), sys.argv[1:]))  # the settings as one record
# -----------------------------------------------------------------------------

if __name__ == "__main__":
    if what not in BENCHMARKS:
        raise ConfigError(f"what must be one of {', '.join(BENCHMARKS)}, got {what!r}")
    if threads:
        torch.set_num_threads(threads)
    BENCHMARKS[what](cfg)
