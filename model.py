"""
GPT-2 and Llama 3 in one file, with the three things Set Block Decoding needs from a transformer:

1. explicit position ids, because SBD feeds the same positions twice (clean half and noisy half);
2. an arbitrary boolean attention mask (True = may attend), because SBD mixes a causal prefix with
   bidirectional blocks; masks are pure functions of (query slot, key slot), see causal_mask below;
3. an exact KV cache that can run a block of queries on top of the cache *without* writing it, and
   can commit the previous block causally and run the new block in the same forward
   (docs/method.md, Inference).

With no optional arguments, forward() is the ordinary causal training path (is_causal=True).
Parameter names mirror the checkpoints people load: GPT-2 names for GPT, Meta's names for Llama.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from configurator import ConfigError

IGNORE_INDEX = -1  # label value that the loss skips (nanoGPT's convention)

# -----------------------------------------------------------------------------
# masks: pure functions of (query slot, key slot), broadcast over index tensors


def causal_mask(q, k):
    """Query slot q may attend key slot k iff k <= q (ordinary next-token attention)."""
    return k <= q


def in_block(q, block_start):
    """Slot q belongs to the bidirectional block iff q >= block_start, the one rule for it: the
    slots that see each other (sbd.hybrid_mask), a training sequence's noisy copies (slots L on,
    sbd.slot_layout) and the slots a block adapter's delta reaches (Linear below)."""
    return q >= block_start


def dense_mask(mask_fn, n_queries, n_keys, query_offset=0, device=None):
    """Materialise mask_fn as a (n_queries, n_keys) bool matrix; query i is slot query_offset + i
    (with a KV cache of length L and T new tokens, query_offset = L and n_keys = L + T)."""
    q = torch.arange(query_offset, query_offset + n_queries, device=device)
    k = torch.arange(n_keys, device=device)
    return mask_fn(q[:, None], k[None, :])  # (n_queries, n_keys)


# -----------------------------------------------------------------------------
# KV cache


class KVCache:
    """Keys and values of the tokens processed causally so far, for every layer: a static cache.

    Layout: self.k[layer], self.v[layer] are (B, n_kv_head, max_len, head_dim) buffers allocated
    once; self.lengths (B,) counts each row's committed tokens, which sit in slots [0, lengths[b]):
    exactly what plain causal decoding would have cached. Slots are positions. A forward of T new
    tokens writes them at slots [lengths[b], lengths[b] + T) and reads all max_len slots, so every
    forward of T tokens has the same shapes (what torch.compile and CUDA graphs need); its mask
    hides the slots a query must not see. Only the FIRST n_commit (processed causally) are
    committed: forward() adds n_commit to the lengths. The other T - n_commit (an SBD block,
    bidirectional) stay in scratch slots, where the next forward overwrites them: nothing of a
    bidirectional forward is ever kept, and no forward copies the cache.
    """

    host_checks = True  # False: its caller checked the whole decode (serving's compiled steps)

    def __init__(self, n_layer, batch_size, n_kv_head, head_dim, max_len, device, dtype):
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.slots = torch.arange(max_len, device=device)  # (max_len,): the keys masks look at

    @property
    def length(self):
        """The rows' common length, as a Python int (a host read)."""
        (length,) = set(self.lengths.tolist())  # rows of different lengths have none
        return length

    @length.setter
    def length(self, n):
        self.lengths.fill_(n)

    def next_slots(self, T):
        """(B, T): the slots of each row's next T tokens, from its length on (their positions)."""
        return self.lengths[:, None] + torch.arange(T, device=self.lengths.device)

    def extend(self, layer, k_new, v_new, n_commit):
        """Write T new keys/values at each row's slots [lengths[b], lengths[b] + T); return the
        whole buffers (B, H, max_len, D). Only the first n_commit become cached (forward() adds
        them to the lengths after all layers); an int, or (B,) per row."""
        B, H, T, D = k_new.shape  # k_new: (B, n_kv_head, T, head_dim)
        L = int(self.lengths.max()) if self.host_checks else -1  # the checks read host ints
        if isinstance(n_commit, int) and not 0 <= n_commit <= T:
            raise ValueError(f"n_commit must be between 0 and the {T} new tokens, got {n_commit}")
        if L + T > self.max_len:
            raise ValueError(f"KV cache full: {L} cached + {T} new tokens > max_len {self.max_len}")
        index = self.next_slots(T)[:, None, :, None].expand(B, H, T, D)
        self.k[layer].scatter_(2, index, k_new)  # in place: row b's slots start at its length
        self.v[layer].scatter_(2, index, v_new)
        return self.k[layer], self.v[layer]  # (B, nkv, max_len, hd), always the whole buffers

    def commit(self, n):
        """The first n tokens (an int, or (B,) per row) of the forward that just ran are now
        cached (forward() calls this)."""
        self.lengths += n

    def forget(self, row, n):
        """Row `row` drops its last n committed tokens (exact SBD's rejected drafts)."""
        self.lengths[row] -= n


def attention(q, k, v, layer, mask, cache, n_commit, dropout_p):
    """Scaled dot-product attention of q (B, n_head, T, hd) over [cache ; k, v (B, n_kv_head, T,
    hd)], a K/V head per n_head // n_kv_head query heads (GQA). mask: None (causal), (T, S) or
    (B, T, S) bool (True = may attend) or its bias, or attention with its mask built in (training
    on a GPU: training/flex.py; no cache, no dropout). With a cache S = max_len: the whole static
    cache is read, the mask hiding the rest."""
    if callable(mask):
        return mask(q, k, v)  # (B, nh, T, hd)
    if cache is not None:
        k, v = cache.extend(layer, k, v, n_commit)  # (B, n_kv_head, max_len, hd)
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)  # (B, 1, T, S): the same mask for every head
    is_causal = mask is None and cache is None  # the fast training path
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=is_causal, enable_gqa=k.size(1) != q.size(1))


def attention_bias(mask, dtype):
    """A bool mask (True = may attend) -> SDPA's additive bias (0 or -inf), made once per forward
    where SDPA would make it in every layer. None, a bias or an attention function pass through."""
    if not torch.is_tensor(mask) or mask.dtype != torch.bool:
        return mask
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf"))


def over_the_cache(mask, pos, cache):
    """A forward's mask over all max_len slots of the cache: the causal default (each query sees
    the slots up to its own) if None; a mask of the first S < max_len slots (dense_mask over
    [cache ; new tokens]) with the slots past S hidden (not written, or scratch)."""
    if mask is None:
        return causal_mask(pos[..., None], cache.slots)  # (B, T, max_len)
    missing = cache.max_len - mask.size(-1)
    hide = False if mask.dtype == torch.bool else float("-inf")
    return F.pad(mask, (0, missing), value=hide) if missing > 0 else mask


def cross_entropy(logits, targets):
    """Mean cross-entropy over positions whose target is not IGNORE_INDEX; logits (B, T, V)."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


# -----------------------------------------------------------------------------
# the block adapter: a low-rank delta only the block's slots see (docs/method.md, Block adapter)


class LowRank(nn.Module):
    """delta(x) = x A^T B^T, A (rank, n_in), B (n_out, rank). B starts at 0, so an adapter that
    has not trained yet changes nothing (LoRA, Hu et al. 2021)."""

    def __init__(self, n_in, n_out, rank):
        super().__init__()
        self.A = nn.Parameter(torch.randn(rank, n_in) / math.sqrt(n_in))
        self.B = nn.Parameter(torch.zeros(n_out, rank))

    def forward(self, x):
        return (x @ self.A.to(x.dtype).T) @ self.B.to(x.dtype).T  # (N, n_out)


class Linear(nn.Linear):
    """nn.Linear, plus the block adapter's delta (attach_adapter) on the rows gate selects.

    gate (B, T) bool marks the block's slots (in_block); every other row is the base layer's
    output, untouched. With gate None (a model without an adapter, or a forward without a block)
    this is nn.Linear, and no adapter code runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_module("delta", None)  # a LowRank once attach_adapter runs

    def forward(self, x, gate=None):
        y = F.linear(x, self.weight, self.bias)  # (B, T, n_out)
        return y if gate is None else add_delta(y, x, gate, self.delta)


def add_delta(y, x, gate, delta):
    """y = base(x) (B, T, n_out); at the rows gate (B, T) selects, y + delta(x); the other rows
    are y itself, bit for bit. The delta is computed for every row and kept where gated: the
    forwards that have a block are nearly all block (a decode step's, the noisy half's)."""
    if delta is None or gate is None:
        return y
    return torch.where(gate[..., None], y + delta(x).to(y.dtype), y)


ADAPTER_LAYERS = {  # which of a block's linear layers carry a delta
    "attention": ("c_attn", "attn.c_proj", "wq", "wk", "wv", "wo"),
    "mlp": ("c_fc", "mlp.c_proj", "w1", "w2", "w3"),
}
ADAPTER_LAYERS["all"] = ADAPTER_LAYERS["attention"] + ADAPTER_LAYERS["mlp"]


class BlockAdapter(nn.Module):
    """The block adapter's own parameters besides the deltas: an input embedding for the mask
    token, used at the block's slots in place of the base model's row (from which it starts, as
    it was when attached)."""

    def __init__(self, mask_embedding, mask_id, rank, layers):
        super().__init__()
        self.mask_embedding = nn.Parameter(mask_embedding.detach().clone().float())  # (dim,)
        self.mask_id, self.rank, self.layers = mask_id, rank, layers

    def embed(self, x, idx, gate):
        """x (B, T, C) the base embeddings of idx (B, T): the mask token's, at gated slots,
        replaced by the adapter's."""
        swap = gate & (idx == self.mask_id)  # (B, T)
        return torch.where(swap[..., None], self.mask_embedding.to(x.dtype), x)


def attach_adapter(model, rank, layers, mask_id):
    """Give model a block adapter of this rank on `layers` ('all', 'attention' or 'mlp'): a
    LowRank delta on each such Linear of every transformer block, and a mask embedding.
    -> the model (its base weights unchanged; freeze_base leaves the adapter alone to train)."""
    if layers not in ADAPTER_LAYERS:
        raise ConfigError(f"adapter_layers must be one of {sorted(ADAPTER_LAYERS)}, got {layers!r}")
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, Linear)
               and any(name.endswith("." + t) for t in ADAPTER_LAYERS[layers])]
    widest = min(min(m.in_features, m.out_features) for _, m in targets)
    if not 1 <= rank <= widest:
        raise ConfigError(f"adapter_rank must be between 1 and the narrowest adapted layer's "
                          f"width {widest}, got {rank}")
    device = model.embedding.weight.device
    for _, m in targets:
        m.delta = LowRank(m.in_features, m.out_features, rank).to(device)
    model.block_adapter = BlockAdapter(model.embedding.weight[mask_id], mask_id, rank, layers)
    return model


# -----------------------------------------------------------------------------
# GPT-2


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence the learned position table covers
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0  # 0 for pretraining is fine; try 0.1+ when fine-tuning on small data
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2; False is a bit better and faster


def dropout_layer(p):
    """nn.Dropout(p), or nn.Identity at p = 0: a Dropout that drops nothing still costs ~4 us a call
    on a CPU, ~8% of the demo model's decode forward. Neither has state: checkpoints load alike."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = dropout_layer(config.dropout)
        self.n_head, self.dropout = config.n_head, config.dropout

    def forward(self, x, layer, mask, cache, n_commit, gate=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x, gate).chunk(3, dim=2)  # each (B, T, C); split() costs ~2 us more
        nh, hs = self.n_head, C // self.n_head
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        y = attention(q, k, v, layer, mask, cache, n_commit, dropout_p)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_dropout(self.c_proj(y, gate))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = dropout_layer(config.dropout)

    def forward(self, x, gate=None):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x, gate)), gate))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, layer, mask, cache, n_commit, gate=None):
        x = x + self.attn(self.ln_1(x), layer, mask, cache, n_commit, gate)
        return x + self.mlp(self.ln_2(x), gate)


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=dropout_layer(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.register_module("block_adapter", None)  # a BlockAdapter once attach_adapter runs
        self.transformer.wte.weight = self.lm_head.weight  # tied embeddings, as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2 paper: scaled residual projections
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def max_seq_len(self):
        return self.config.block_size

    @property
    def embedding(self):
        return self.transformer.wte

    def forward(self, idx, targets=None, pos=None, mask=None, cache=None, n_commit=None, at=None,
                block_start=None):
        """idx (B, T) token ids -> logits (B, T, vocab), and the loss if targets (B, T) are given.
        pos: (T,) or (B, T) position ids; default = slot index (each row's cache length + 0..T-1).
        mask: (T, S) or (B, T, S) bool, True = may attend, default causal; with a cache, over its
        first S slots (the rest hidden).
        cache: a KVCache; the first n_commit (default all T; or (B,) per row) tokens are appended.
        at: (B, T) bool -> logits (N, vocab) only where True, row by row (training: the labelled
        slots, as the head is a large share of a small model's work).
        block_start: the block's first slot (an int, or (B, 1) per row): the slots a block adapter
        sees (in_block); None: no slot (every causal forward)."""
        pos, mask, n_commit = resolve_defaults(idx, pos, mask, cache, n_commit, self.max_seq_len)
        gate = None if self.block_adapter is None else block_gate(self, idx, cache, block_start)
        x = self.transformer.wte(idx) if gate is None else adapted_embedding(self, idx, gate)
        x = self.transformer.drop(x + self.transformer.wpe(pos))  # (B, T, C)
        mask = attention_bias(mask, x.dtype)  # (T, S) or (B, T, S), once for all layers
        for layer, block in enumerate(self.transformer.h):
            x = block(x, layer, mask, cache, n_commit, gate)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x if at is None else x[at])  # (B, T, vocab) or (N, vocab)
        if cache is not None:
            cache.commit(n_commit)
        return logits, (cross_entropy(logits, targets) if targets is not None else None)

    def new_cache(self, batch_size, max_len, device, dtype=None):
        c, dtype = self.config, dtype or self.lm_head.weight.dtype  # the model's, by default
        return KVCache(c.n_layer, batch_size, c.n_head, c.n_embd // c.n_head, max_len, device,
                       dtype)


def block_gate(model, idx, cache, block_start):
    """(B, T) bool: which of the forward's slots are in the block (in_block), or None where no
    adapter is attached or no block is given. A query's slot is its index in the forward, after
    each row's cached tokens when there is a cache (the slots the masks use)."""
    if getattr(model, "block_adapter", None) is None or block_start is None:
        return None
    B, T = idx.size()
    slots = torch.arange(T, device=idx.device) if cache is None else cache.next_slots(T)
    return in_block(slots, torch.as_tensor(block_start, device=idx.device)).expand(B, T)


def adapted_embedding(model, idx, gate):
    """The input embeddings of idx (B, T), the mask token's replaced by the adapter's own at the
    block's slots."""
    x = model.embedding(idx)  # (B, T, C)
    return x if gate is None else model.block_adapter.embed(x, idx, gate)


def resolve_defaults(idx, pos, mask, cache, n_commit, max_seq_len):
    """GPT's and Llama's optional forward() arguments, filled in and checked."""
    T = idx.size(1)
    if pos is None:  # slot positions: 0..T-1, or each row's cache length + 0..T-1
        pos = torch.arange(T, device=idx.device) if cache is None else cache.next_slots(T)
    last = int(pos.max()) if pos.numel() and (cache is None or cache.host_checks) else -1
    if last >= max_seq_len:
        raise ValueError(f"position {last} is past the model's context of {max_seq_len} tokens")
    if cache is not None:
        mask = over_the_cache(mask, pos, cache)
    n_commit = T if n_commit is None else n_commit
    if cache is None and n_commit != T:
        raise ValueError("n_commit only means something with a KV cache")
    return pos, mask, n_commit


# -----------------------------------------------------------------------------
# Llama 3


@dataclass
class LlamaConfig:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8  # grouped-query attention: n_heads // n_kv_heads query heads per K/V head
    vocab_size: int = 128256
    multiple_of: int = 1024  # the FFN hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = True  # Llama 3.1's long-context frequency scaling (docs/llama.md)
    rope_scale_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    max_seq_len: int = 131072  # longest position the model was trained for
    ffn_hidden_size: int = None  # the FFN width if a checkpoint states it (HF's intermediate_size)
    tie_word_embeddings: bool = False  # Llama 3.2 1B/3B: the output head IS the embedding matrix
    head_size: int = None  # the per-head width if a checkpoint states it (HF's head_dim; Qwen-3)
    qk_norm: bool = False  # Qwen-3: an RMSNorm over each head's queries and keys, before RoPE

    @property
    def head_dim(self):  # Llama: dim // n_heads; Qwen-3 states its own (0.6B: 1024 // 16 != 128)
        return self.head_size or self.dim // self.n_heads

    @property
    def ffn_hidden(self):
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        hidden = int(2 * 4 * self.dim / 3)  # SwiGLU, 3 matrices: 2/3 of 4*dim keeps the param count
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


def rope_frequencies(config):
    """Rotary inverse frequencies (head_dim // 2,), with Llama 3.1's scaling if enabled.

    Llama 3.1 keeps high frequencies (short wavelengths), divides low ones by scale_factor (so they
    stretch over a longer context) and interpolates smoothly in between.
    """
    hd = config.head_dim
    freqs = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if not config.use_scaled_rope:
        return freqs.float()
    scale, low, high, old_ctx = (config.rope_scale_factor, config.rope_low_freq_factor,
                                 config.rope_high_freq_factor, config.rope_original_context)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * freqs / scale + smooth * freqs
    scaled = torch.where(wavelen < old_ctx / high, freqs,
                         torch.where(wavelen > old_ctx / low, freqs / scale, smoothed))
    return scaled.float()


def rotary_cos_sin(pos, inv_freq):
    """cos and sin of angle pos * freq; pos (T,) or (B, T) -> each (T, hd/2) or (B, T, hd/2)."""
    angles = pos.to(torch.float32)[..., None] * inv_freq  # (..., T, hd/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate x (B, n_heads, T, hd) by the position angles.

    Convention: Meta's interleaved pairs. Pair i of a head, (x[2i], x[2i+1]), turns by pos * freq_i.
    HF checkpoints use rotate_half pairs (x[i], x[i + hd/2]); the HF loader permutes their q/k
    weights into this convention, so this function is the only rotary code in the project.
    """
    if cos.dim() == 3:  # per-row positions (B, T, hd/2) -> broadcast over heads
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, hd/2)
    x_pairs = x.float().unflatten(-1, (-1, 2))  # (B, nh, T, hd/2, 2)
    x0, x1 = x_pairs[..., 0], x_pairs[..., 1]  # (B, nh, T, hd/2) each
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)  # (B, nh, T, hd/2, 2)
    return out.flatten(-2).type_as(x)  # (B, nh, T, hd)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()  # computed in fp32, as Meta's reference, then cast back
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class LlamaAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        hd, self.qk_norm = config.head_dim, config.qk_norm
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd
        self.wq = Linear(config.dim, config.n_heads * hd, bias=False)
        self.wk = Linear(config.dim, config.n_kv_heads * hd, bias=False)
        self.wv = Linear(config.dim, config.n_kv_heads * hd, bias=False)
        self.wo = Linear(config.n_heads * hd, config.dim, bias=False)
        if config.qk_norm:  # Qwen-3: one weight of hd per norm, shared by all heads
            self.q_norm, self.k_norm = RMSNorm(hd, config.norm_eps), RMSNorm(hd, config.norm_eps)

    def project(self, x, gate=None):
        """x (B, T, dim) -> q, k, v (serving/layout.py fuses the three products into one)."""
        return self.wq(x, gate), self.wk(x, gate), self.wv(x, gate)

    def forward(self, x, cos, sin, layer, mask, cache, n_commit, gate=None):
        """x (B, T, dim) -> (B, T, dim), grouped-query attention: q gets n_heads heads, k and v
        n_kv_heads, of head_dim each. q and k are normed (if qk_norm), then rotated: the cache holds
        rotated keys. k and v enter attention() with n_kv_heads heads, each serving
        n_heads // n_kv_heads query heads, so the cache stays that small."""
        B, T, C = x.size()
        q, k, v = self.project(x, gate)  # (B, T, nh * hd), (B, T, nkv * hd) twice
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        if self.qk_norm:  # over each head's hd coordinates
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # keys are cached rotated
        y = attention(q, k, v, layer, mask, cache, n_commit, dropout_p=0.0)  # (B, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1), gate)  # (B, T, C)


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = Linear(config.dim, config.ffn_hidden, bias=False)  # gate
        self.w2 = Linear(config.ffn_hidden, config.dim, bias=False)  # down
        self.w3 = Linear(config.dim, config.ffn_hidden, bias=False)  # up

    def forward(self, x, gate=None):
        return self.w2(F.silu(self.w1(x, gate)) * self.w3(x, gate), gate)  # SwiGLU


class LlamaBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = LlamaAttention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin, layer, mask, cache, n_commit, gate=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, layer, mask, cache, n_commit,
                               gate)
        return h + self.feed_forward(self.ffn_norm(h), gate)


class Llama(nn.Module):
    activation_checkpointing = False  # train.py's switch: recompute block activations in backward

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList([LlamaBlock(config) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_module("block_adapter", None)  # a BlockAdapter once attach_adapter runs
        self.tie_weights()
        self.register_buffer("inv_freq", rope_frequencies(config), persistent=False)  # (hd/2,)
        if self.tok_embeddings.weight.device.type != "meta":  # a checkpoint overwrites it all
            self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def tie_weights(self):
        """With config.tie_word_embeddings (Llama 3.2 1B/3B) the output head is the embedding
        matrix: one Parameter under two names, as GPT-2's: one gradient, one AdamW state."""
        if self.config.tie_word_embeddings and isinstance(self.output, nn.Linear):
            self.output.weight = self.tok_embeddings.weight  # (laid out for decoding: a copy)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """nn.Module's, keeping a tie: both names must hold the same matrix and stay one Parameter
        (assign=True, how a checkpoint reaches a model built on meta, would make them two)."""
        emb, out = state_dict.get("tok_embeddings.weight"), state_dict.get("output.weight")
        tied = self.config.tie_word_embeddings and emb is not None and out is not None
        if tied and out is not emb and not torch.equal(out, emb):
            raise ValueError("tied embeddings (tie_word_embeddings=True), but the state dict's "
                             "output.weight differs from its tok_embeddings.weight")
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.tie_weights()
        return result

    def _apply(self, fn, recurse=True):
        """model.to(torch.bfloat16) casts float buffers too, and bf16 rotary frequencies would turn
        position 8000 by whole radians: after any .to() / .cuda() / .to_empty(), redo them in fp32.
        A conversion may also give modules new Parameters, untying a tied head: tie it again."""
        super()._apply(fn, recurse)
        self.tie_weights()
        self.inv_freq = rope_frequencies(self.config).to(self.inv_freq.device)
        return self

    @property
    def max_seq_len(self):
        return self.config.max_seq_len

    @property
    def embedding(self):
        return self.tok_embeddings

    def forward(self, idx, targets=None, pos=None, mask=None, cache=None, n_commit=None, at=None,
                block_start=None):
        """Same contract as GPT.forward: idx (B, T) -> logits (B, T, vocab) and optional loss."""
        B, T = idx.size()
        pos, mask, n_commit = resolve_defaults(idx, pos, mask, cache, n_commit, self.max_seq_len)
        gate = None if self.block_adapter is None else block_gate(self, idx, cache, block_start)
        cos, sin = rotary_cos_sin(pos, self.inv_freq)  # (T, hd/2) or (B, T, hd/2)
        x = self.tok_embeddings(idx) if gate is None else adapted_embedding(self, idx, gate)
        mask = attention_bias(mask, x.dtype)  # (T, S) or (B, T, S), once for all layers
        # activation checkpointing keeps only each block's input; backward recomputes the rest
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for layer, block in enumerate(self.layers):
            args = (x, cos, sin, layer, mask, cache, n_commit, gate)
            x = checkpoint(block, *args, use_reentrant=False) if recompute else block(*args)
        x = self.norm(x)
        logits = self.output(x if at is None else x[at])  # (B, T, vocab) or (N, vocab)
        if cache is not None:
            cache.commit(n_commit)
        return logits, (cross_entropy(logits, targets) if targets is not None else None)

    def new_cache(self, batch_size, max_len, device, dtype=None):
        c, dtype = self.config, dtype or self.output.weight.dtype
        return KVCache(c.n_layers, batch_size, c.n_kv_heads, c.head_dim, max_len, device, dtype)


# -----------------------------------------------------------------------------
# the optimizer


def configure_optimizer(model, weight_decay, learning_rate, betas, device_type):
    """AdamW, weight decay on matrices only (not on norms, biases or 1-d parameters), as nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # the fused kernel: one pass over each tensor instead of a dozen (on a CPU, SmolLM2-135M's step
    # takes 0.07 s instead of 0.6 s)
    fused = device_type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)
