"""
A model's weights laid out for decoding, the gpt-fast way: once, before the first decode, in place
(model.py's GPT and Llama read them through the same forward; a Llama's attention and feed-forward
modules become FusedAttention and FusedFeedForward, which read the fused matrices). The blocks'
matrices are fused where they
share an input, contiguous, in the decode dtype, and optionally weight-only quantized for torch's
own CPU kernels: 'int8' (a scale per row) or 'int4', a GGUF file's own 4-bit blocks (Q4_1's grid,
as llama.cpp reads them). Those kernels are fast for a few rows, not for SBD's blocks, so a layer
keeps a dense copy for wider forwards: which widths gain is the CPU's (python -m bench.four_bit).

    model = lay_out_for_decoding(model, torch.bfloat16, "int4", quantized_rows=1, four_bit=True)
    compile, weights = fastest_setup(model, "auto", "auto", True)  # SmolLM2's file as loaded
"""

import functools
import math

import torch
from torch import nn
from torch.nn import functional as F

from configurator import ConfigError
from model import GPT, FeedForward, Llama, LlamaAttention, LowRank, add_delta
from serving.batched import cxx_compiler

WEIGHTS = ("trained", "int8", "int4")  # lay_out_for_decoding's weight formats
GROUP = 32  # a 4-bit run: GGUF's Q4_1 block, 32 weights of a row with one scale and one minimum


class DecodeLinear(nn.Module):
    """x @ w.T (+ bias) for decoding: a layer's matrices (out_i, in) laid out once as one w (fused:
    one product instead of several), contiguous, in the decode dtype. With weights 'int8' or
    'int4' they are also quantized for torch's own CPU kernels, which a forward of at most
    quantized_rows rows uses (the kernels are fast for one token, not for a block: which widths
    gain is the CPU's, `python -m bench.four_bit`); wider forwards read w, dropped if none can."""

    def __init__(self, weights, bias, dtype, kind="trained", quantized_rows=0, deltas=()):
        super().__init__()
        self.delta = fused_delta(deltas, dtype)  # the block adapter's, if the layers had one
        w = torch.cat([w.detach() for w in weights]).to(dtype).contiguous()  # (N, K)
        self.kind, self.quantized_rows = kind, quantized_rows if kind != "trained" else 0
        self.register_buffer("weight", None if self.quantized_rows == math.inf else w)
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        if kind == "int8":  # one scale per row, symmetric: w = scale * q, q in -127..127
            scales = w.float().abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,)
            self.register_buffer("codes", (w.float() / scales[:, None]).round().to(torch.int8))
            self.register_buffer("scales", scales.to(dtype))
        elif kind == "int4":
            codes, pairs = q4_1_codes(w.float())
            self.register_buffer("codes", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                codes, 1))  # two codes a byte, in the kernel's tiles
            self.register_buffer("pairs", pairs.to(dtype))  # (K / 32, N, 2): scale, zero

    def forward(self, x, gate=None):
        rows, K = x.numel() // x.size(-1), x.size(-1)  # fixed per compiled width: no branch left
        if rows > self.quantized_rows:
            y = F.linear(x, self.weight)
        elif self.kind == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(rows, K), self.codes, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(rows, K), self.codes, GROUP,
                                                            self.pairs)
        y = y.view(*x.shape[:-1], -1)  # (..., N)
        return add_delta(y if self.bias is None else y + self.bias, x, gate, self.delta)


class FusedAttention(LlamaAttention):
    """LlamaAttention with q, k, v from one product: wqkv is [wq ; wk ; wv]."""

    def project(self, x, gate=None):
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        return self.wqkv(x, gate).split([nh * hd, nkv * hd, nkv * hd], dim=-1)


class FusedFeedForward(FeedForward):
    """FeedForward with the gate and up products as one: w13 is [w1 ; w3]."""

    def forward(self, x, gate=None):
        w1x, w3x = self.w13(x, gate).chunk(2, dim=-1)
        return self.w2(F.silu(w1x) * w3x, gate)  # SwiGLU, as FeedForward's


def fused_delta(deltas, dtype):
    """The block adapter's deltas of layers fused into one (LowRank A (r, K), B (N_i, r) each) as
    one LowRank: A stacked (n r, K), B block-diagonal (sum N_i, n r), so that one delta gives
    each layer's output side by side, as the fused weight does. None where the layers had none."""
    if not deltas or deltas[0] is None:
        return None
    fused = LowRank(1, 1, 1)
    fused.A = torch.nn.Parameter(torch.cat([d.A.detach() for d in deltas]).to(dtype),
                                 requires_grad=False)
    fused.B = torch.nn.Parameter(torch.block_diag(*[d.B.detach() for d in deltas]).to(dtype),
                                 requires_grad=False)
    return fused


def q4_1_codes(w):
    """w (N, K) fp32 -> 4-bit codes (N, K) int32 and (scale, zero) pairs (K / 32, N, 2), as GGUF's
    Q4_1 stores a run of 32 weights of a row: m + d * q, q in 0..15, m the run's minimum and
    d = (max - m) / 15. A Q4_1 file's dequantized weights come back exactly (to fp32 rounding of
    d); other weights are rounded to that grid. torch's kernel reads w = (q - 8) * scale + zero:
    scale = d, zero = m + 8d."""
    N, K = w.shape
    if K % GROUP:
        raise ConfigError(f"weights=int4 needs rows of a multiple of {GROUP} weights, got {K}")
    runs = w.view(N, K // GROUP, GROUP)
    m, top = runs.amin(-1, keepdim=True), runs.amax(-1, keepdim=True)  # (N, K/G, 1)
    d = (top - m) / 15
    q = ((runs - m) / torch.where(d > 0, d, 1)).round().clamp(0, 15)  # (N, K/G, G)
    pairs = torch.cat([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous()  # (K/G, N, 2)
    return q.view(N, K).int(), pairs


@torch.no_grad()
def lay_out_for_decoding(model, dtype, weights="trained", quantized_rows=1, four_bit=False):
    """Lay the model's weights out for decoding, in place, once (it can no longer train): the
    model in dtype, every block's matrices fused where they share an input (a Llama's wq, wk, wv
    as wqkv; w1 and w3 as w13) and laid out as DecodeLinear; the output head stays dense.
    weights 'int8' or 'int4' quantize the blocks' matrices for forwards of at most quantized_rows
    rows (math.inf: every forward, and no dense copy kept). 'int4' keeps the 4-bit blocks of a
    GGUF file (four_bit: the model's weights came from one, pretrained.loading.four_bit_blocks),
    as llama.cpp reads them; a model without them is refused. -> the model."""
    if weights not in WEIGHTS:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if getattr(model, "laid_out", None) is not None or not isinstance(model, (GPT, Llama)):
        return model  # done already (one model in two roles), or another module
    if weights == "int4" and not four_bit:
        raise ConfigError("weights=int4 keeps the 4-bit blocks of a GGUF file (Q4_0/Q4_1/...), "
                          "and this model's weights did not come from one: use int8 or trained")
    if weights != "trained" and next(model.parameters()).device.type != "cpu":
        raise ConfigError(f"weights={weights} runs torch's CPU kernels: decode on the CPU")
    model.to(dtype)
    linear = functools.partial(DecodeLinear, dtype=dtype, kind=weights,
                               quantized_rows=quantized_rows)
    if isinstance(model, GPT):
        for block in model.transformer.h:
            for owner, name in ((block.attn, "c_attn"), (block.attn, "c_proj"),
                                (block.mlp, "c_fc"), (block.mlp, "c_proj")):
                layer = getattr(owner, name)
                setattr(owner, name, linear([layer.weight], layer.bias, deltas=[layer.delta]))
        model.lm_head = DecodeLinear([model.lm_head.weight], None, dtype)
        model.laid_out = weights
        return model
    for block in model.layers:
        a, f = block.attention, block.feed_forward
        a.wqkv = linear([a.wq.weight, a.wk.weight, a.wv.weight], None,
                        deltas=[a.wq.delta, a.wk.delta, a.wv.delta])
        a.wo = linear([a.wo.weight], None, deltas=[a.wo.delta])
        f.w13 = linear([f.w1.weight, f.w3.weight], None, deltas=[f.w1.delta, f.w3.delta])
        f.w2 = linear([f.w2.weight], None, deltas=[f.w2.delta])
        del a.wq, a.wk, a.wv, f.w1, f.w3
        a.__class__, f.__class__ = FusedAttention, FusedFeedForward  # read wqkv and w13
    model.output = DecodeLinear([model.output.weight], None, dtype)
    model.laid_out = weights
    return model


def fastest_setup(model, compile, weights, as_loaded_four_bit):
    """sample.py's and evaluate.py's 'auto' (compile None or 'auto', weights 'auto') -> (compile,
    weights), what decodes fastest here: a compiled step for a model of 10M parameters or more
    (below, the compile costs more than it saves) where torch.compile can run; a GGUF file's
    4-bit blocks on a CPU where the model's weights are those blocks, as loaded
    (as_loaded_four_bit; a fine-tune's are not: 4 bits would quantize it again, another model
    than the one trained). docs/fast_decoding.md."""
    device = next(model.parameters()).device.type
    if compile in (None, "auto"):
        big = sum(p.numel() for p in model.parameters()) >= 10_000_000
        compile = big and (device == "cuda" or cxx_compiler() is not None)
    if weights == "auto":
        weights = "int4" if as_loaded_four_bit and device == "cpu" else "trained"
    return bool(compile), weights
