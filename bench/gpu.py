"""
Llama-3.1-8B decoding cost on one GPU, measured: the real-hardware version of the paper's Table 3.

    python -m bench.gpu                   # 8B shapes, random bf16 weights; ~1 min on an H100/H200
    python -m bench.gpu --bandwidth=3350  # state the GPU's peak memory bandwidth (GB/s) yourself
    python -m bench.gpu --preset=llama-tiny --device=cpu  # CPU smoke test (tests/test_llama_sbd.py)

1. NTP decoding, batch 1, at KV lengths 1k and 8k: the median time of one 1-token forward through
   the KV cache, as tokens/s, against the memory-bandwidth ceiling. A decode step must read every
   weight once (the output head included, the embedding table only one row) plus the whole KV
   cache, so
       ceiling tokens/s = bandwidth / (weight bytes + KV bytes),
       achieved bandwidth = bytes / measured time.
2. The time of a k-token forward on top of the same cache over the 1-token forward,
   k = 1, 2, 4, ..., 64: what SBD pays per forward for predicting k tokens at once (the paper models
   it: 1.004 at k=16, 1.015 at k=64 for FP8 on an H100 at KV length 16; here it is measured, bf16,
   eager PyTorch). Two columns: the forward itself, its mask built once outside the timing (the
   block's keys are written into the cache's spare slots, a view, no copy), and
   batched.block_forward exactly as decoding runs it (decode.hybrid_forward: the same view, the
   block never committed, plus what decoding does around the forward, its mask built every time).
   Before the table, the SDPA kernels that accept such a block forward (a boolean mask and
   grouped-query heads: torch's docs say only the flash and math kernels do GQA, and flash takes no
   mask, so a GPU may be left with MATH).
3. Eq. 16 with the measured times: the wall-clock speed-up of a block of k=16 tokens decoded in l=4
   forwards (an NFE speed-up of 4): 16 t(1) / (t(32) + 3 t(16)). The paper's roofline says 3.98.
Next to each measured ratio and speed-up: roofline.py's `llama31_8b` prediction for this model's
shapes on this GPU's preset (H200/H100/A100 bf16, the data sheets' dense peaks; the bandwidth below
when it is known), i.e. max(flops/peak, bytes/bandwidth) summed over every matmul and the attention
of the forward.

Weights are random (built on the meta device, then allocated on the GPU and initialised there: no
16 GB copy on the CPU); decoding speed does not depend on their values. Timing: CUDA-synchronised
wall clock around each forward, warmup forwards first, median of reps. Eager mode: at batch 1 the
GPU waits for Python to launch ~15 kernels per layer, so a 1-token forward is slower than its
bandwidth bound and the k-token ratios come out closer to 1 than a CUDA-graph build (gpt-fast) would
give; read the achieved-bandwidth figure with that in mind.
"""

import functools
import statistics
import sys
import time
import warnings

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import bench.roofline as roofline
from configurator import ConfigError, configure, pick_device
from model import Llama, LlamaConfig, dense_mask
from pretrained.shapes import LLAMA_PRESETS
from sbd import hybrid_mask
from serving import batched
from serving.settings import ServingSettings

# -----------------------------------------------------------------------------
preset = "llama3.1-8b"  # a key of pretrained.shapes.LLAMA_PRESETS ('llama-tiny': CPU smoke test)
device = ""  # '' = autodetect cuda -> mps -> cpu
dtype = "bfloat16"  # weights and KV cache
bandwidth = 0.0  # peak memory bandwidth in GB/s (1e9 B/s); 0 = from the GPU's name (BANDWIDTH)
kv_lengths = (1024, 8192)  # tokens already in the KV cache
ks = (1, 2, 4, 8, 16, 32, 64)  # tokens per forward
static = False  # also time the compiled decode step (CUDA graphs: batched.compiled_step)
warmup = 5  # untimed forwards before each measurement
reps = 20  # timed forwards; the median is reported
seed = 1337
roofline_hardware = ""  # a key of roofline.HARDWARE; '' = from the GPU's name (bf16 presets)
configure(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------
# GB/s, NVIDIA's data sheets; the first matching name wins
BANDWIDTH = [("H200", 4800), ("H100 PCIe", 2000), ("H100 NVL", 3900), ("H100", 3350),
             ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555)]
ROOFLINE_PRESET = [("H200", "h200_bf16"), ("H100", "h100_bf16"), ("A100", "a100_bf16")]  # SXM peaks


def synchronize():
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn, before=lambda: None):
    """Median wall-clock ms of fn() over `reps` calls, after `warmup` calls; before() untimed."""
    times = []
    for i in range(warmup + reps):
        before()
        synchronize()
        t0 = time.perf_counter()
        fn()
        synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def sdpa_kernels(n_queries, mask):
    """The SDPA kernels that accept this model's attention with a boolean mask and grouped-query
    heads, as an SBD block forward calls it. SDPA runs the first that does; MATH alone means no
    fused kernel: the score matrix is materialised and the K/V heads are copied to match the query
    heads, in every layer of every forward."""
    q = torch.randn(1, config.n_heads, n_queries, config.head_dim, device=device, dtype=ptdtype)
    kv = torch.randn(1, config.n_kv_heads, mask.size(-1), config.head_dim, device=device,
                     dtype=ptdtype)
    accepted = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # each refusal also warns why
                F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, enable_gqa=True)
            accepted.append(backend.name)
        except RuntimeError:  # "No available kernel"
            pass
    return ", ".join(accepted)


def roofline_setup():
    """-> (time function (block, kv, bs, hw) of this model's shapes, hardware dict), or (None, None)
    off a known GPU. The preset's bytes per weight/KV follow --dtype, and --bandwidth, when known,
    replaces its bandwidth."""
    name = roofline_hardware or next((preset for key, preset in ROOFLINE_PRESET if key in gpu), "")
    if not name:
        return None, None
    hw = roofline.resolve_hardware(name, bandwidth_gbs=bandwidth, weight_bytes=elem, kv_bytes=elem)
    shape = dict(dim=config.dim, n_layers=config.n_layers, n_heads=config.n_heads,
                 n_kv_heads=config.n_kv_heads, head_dim=config.head_dim, ffn=config.ffn_hidden,
                 ffn_matrices=3, vocab=config.vocab_size)
    print(f"roofline ({name}): {hw['peak'] / 1e12:g} TFLOP/s, {hw['bandwidth'] / 1e9:g} GB/s, "
          f"{elem} B per weight and KV element; the `llama31_8b` formulas of roofline.py on this "
          "model's shapes")
    return functools.partial(roofline.model_time, shape=shape), hw


def build_model(config, device, dtype):
    """Random weights straight on `device`: meta has the shapes, to_empty allocates, init fills."""
    with torch.device("meta"):
        model = Llama(config).to(dtype)
    model = model.to_empty(device=device)  # (Llama._apply recomputes rotary frequencies in fp32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.eval()


def static_times(L0, eager_t1):
    """4. The same forwards through the product's compiled decode step (batched.decode_forward on
    a cache of compiled decoding: the static cache, read whole, one CUDA graph per width): NTP
    decode vs the bandwidth ceiling, t(k)/t(1), and Eq. 16 from these times."""
    settings = ServingSettings(mask_id=None, k=max(ks), compiled=True)
    cache = batched.new_cache(model, torch.zeros(1, L0, dtype=torch.long, device=device),
                               2 * max(ks) + 1, settings)
    for buffer in cache.k + cache.v:
        buffer.normal_()
    cache.widths = sorted(set(ks) | {32})  # time each width as it is, unpadded
    tokens = torch.randint(config.vocab_size, (1, 2 * max(ks)), device=device)

    def reset():
        cache.length = L0

    times = {}
    for k in cache.widths:
        times[k] = median_ms(lambda: batched.decode_forward(model, cache, tokens[:, :k],
                                                             int(k == 1)), reset)
    step_bytes = weight_bytes + L0 * kv_bytes_per_token
    share = f", {step_bytes / (times[1] / 1000) / 1e9 / bandwidth:.0%} of {bandwidth:g} GB/s" \
        if bandwidth else ""
    print(f"KV {L0}, static cache + CUDA graphs: NTP decode {times[1]:.2f} ms/token "
          f"({eager_t1 / times[1]:.2f}x eager){share}")
    print("    t(k)/t(1): " + ", ".join(f"k={k} {times[k] / times[1]:.3f}" for k in ks))
    if 16 in times:
        print(f"    Eq. 16, k=16 in l=4 forwards: "
              f"{16 * times[1] / (times[32] + 3 * times[16]):.2f}x")


torch.manual_seed(seed)
device = pick_device(device)
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
config = LlamaConfig(**LLAMA_PRESETS[preset])
if max(kv_lengths) + 3 * max(ks) > config.max_seq_len:
    raise ConfigError(f"KV length {max(kv_lengths)} + 3 x {max(ks)} tokens is past {preset}'s "
                     f"context of {config.max_seq_len}: lower --kv_lengths or --ks")
if not device.startswith("cuda") and config.dim >= 1024:
    raise ConfigError(f"{preset} on {device} would take hours: this is a GPU benchmark "
                     "(--preset=llama-tiny on a CPU)")
if not bandwidth and device.startswith("cuda"):
    name = torch.cuda.get_device_name()
    bandwidth = next((gbs for key, gbs in BANDWIDTH if key in name), 0.0)
gpu = torch.cuda.get_device_name() if device.startswith("cuda") else device
model = build_model(config, device, ptdtype)
elem = torch.finfo(ptdtype).bits // 8
n_params = sum(p.numel() for p in model.parameters())
# a decode step reads every weight, but only one row of the embedding table
weight_bytes = (n_params - model.tok_embeddings.weight.numel() + config.dim) * elem
kv_bytes_per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * elem  # k and v
print(f"{preset}: {n_params:,} parameters in {dtype} on {gpu} (torch {torch.__version__}); "
      f"a decode step reads {weight_bytes / 1e9:.3g} GB of weights + "
      f"{kv_bytes_per_token / 1024:.3g} KiB per cached token; "
      + (f"peak bandwidth {bandwidth:g} GB/s" if bandwidth
         else "peak bandwidth unknown: pass --bandwidth=<GB/s>"))
model_time, hw = roofline_setup()  # the roofline's prediction, when this GPU has a preset
if model_time is None:
    print("roofline: no preset for this device (pass --roofline_hardware=h100_bf16 or another key "
          "of roofline.HARDWARE to print one anyway)")

with torch.inference_mode():
    for L0 in kv_lengths:
        cache = model.new_cache(1, L0 + 3 * max(ks), device, ptdtype)
        for buffer in cache.k + cache.v:
            buffer.normal_()  # contents do not change the cost; random keys keep softmax honest
        tokens = torch.randint(config.vocab_size, (1, 2 * max(ks)), device=device)

        def reset():  # every timed forward starts from L0 cached tokens
            cache.length = L0

        # 1. NTP decoding: one token in, committed to the cache (the view path, as ntp_generate)
        t1 = median_ms(lambda: model(tokens[:, :1], cache=cache), reset)
        step_bytes = weight_bytes + L0 * kv_bytes_per_token
        ceiling = f", {step_bytes / (t1 / 1000) / 1e9 / bandwidth:.0%} of {bandwidth:g} GB/s; " \
                  f"ceiling {bandwidth * 1e9 / step_bytes:.1f} tokens/s" if bandwidth else ""
        print(f"\nKV {L0}: NTP decode {t1:.2f} ms/token = {1000 / t1:.1f} tokens/s; "
              f"{step_bytes / 1e9:.3g} GB read per token -> "
              f"{step_bytes / (t1 / 1000) / 1e9:.3g} GB/s achieved{ceiling}")
        if model_time:
            print(f"KV {L0}: the roofline's 1-token forward "
                  f"{1000 * model_time(1, L0, 1, hw):.3g} ms (measured {t1:.2f} ms)")

        # 2. k tokens in one forward over the same cache, a block attending to the prefix and
        # itself; by hand, not decode.hybrid_forward: the forward alone, mask built outside timing
        def block_mask(k):
            return dense_mask(lambda q, key: hybrid_mask(q, key, L0), k, L0 + k, query_offset=L0,
                              device=device)

        print(f"KV {L0}: SDPA kernels that take a masked grouped-query block of {max(ks)}: "
              f"{sdpa_kernels(max(ks), block_mask(max(ks)))}")
        print(f"KV {L0}: k-token forward / 1-token forward, median of {reps}")
        print(f"{'k':>4} {'forward ms':>11} {'ratio':>7} {'batched.block_forward ms':>21} "
              f"{'ratio':>7} {'roofline':>9}")
        times, sbd_times = {}, {}
        for k in ks:
            mask = block_mask(k)
            times[k] = median_ms(lambda: model(tokens[:, :k], mask=mask, cache=cache, n_commit=k),
                                 reset)
            sbd_times[k] = median_ms(lambda: batched.block_forward(model, cache, tokens[:, :0],
                                                                    tokens[:, :k]), reset)
            predicted = (f"{roofline.slowdown(model_time, k, L0, 1, hw):9.3f}" if model_time
                         else f"{'-':>9}")
            print(f"{k:4d} {times[k]:11.2f} {times[k] / t1:7.3f} {sbd_times[k]:21.2f} "
                  f"{sbd_times[k] / t1:7.3f} {predicted}")

        # 3. Eq. 16: a block of 16 in 4 forwards; the first also commits the previous block (2k in)
        if 16 in ks and 32 in ks:
            first = median_ms(lambda: batched.block_forward(model, cache, tokens[:, :16],
                                                             tokens[:, 16:32]), reset)
            predicted = (f", this roofline {roofline.eq16(model_time, 16, 4, L0, 1, hw):.2f}x"
                         if model_time else "")
            print(f"KV {L0}: Eq. 16, k=16 in l=4 forwards: wall-clock speed-up "
                  f"{16 * t1 / (times[32] + 3 * times[16]):.2f}x (forward column), "
                  f"{16 * t1 / (first + 3 * sbd_times[16]):.2f}x (batched.block_forward); "
                  f"the paper's roofline 3.98x{predicted}")
        cache = None  # free this length's cache before the next one is allocated
        if static:
            static_times(L0, t1)
