"""
Decoding batches for serving: next-token decoding (NTP, the baseline) and Set Block Decoding (the
paper's Algorithms 2-3; docs/method.md, Inference), eager or compiled through a static KV cache,
and the step view. The method's rules (the hybrid mask, the block's first token, when a row stops)
are sbd.py's and decode.py's, called here; decode.py decodes one prompt with them on one screen.
What is serving's own: forwards padded to a few compiled widths (padded_forward), the cache kept
per shape, the compiled step.

Both decoders share decode.py's convention, so that their forward counts and timings compare like
with like: prompt[:-1] is prefilled causally into the KV cache (one forward, counted apart as the
prefill), and the last prompt token stays "pending": the first decode forward feeds it, as every
later forward feeds the newest tokens.

    settings = DecodeSettings(mask_id=31, stop_ids=(30,), k=16, gamma=0.01)  # sampling.py
    tokens, stats = sbd_generate(model, prompt, settings, max_new_tokens=64)
"""

import functools
import os
import shutil
import time
from dataclasses import dataclass

import torch

import decode
from configurator import ConfigError
from decode import DecodeStats, hybrid_forward, reveal_first, stop_reached
from sampling import next_token, reveal_step
from sbd import block_predictions, hybrid_mask
from serving.settings import serving_settings

# -----------------------------------------------------------------------------
# what serving's decoders return besides tokens: the reference's counts, timings, the step view


@dataclass
class ServingStats(DecodeStats):
    """decode.DecodeStats, plus what serving's decoders also measure (bench/ reads it)."""

    prefill_time: float = None  # seconds of the prefill
    wall_time: float = None  # seconds of the whole decode, prefill included
    steps: list = None  # the step view (record_steps): one Step per decode forward
    # exact SBD only: forwards whose every reveal was rejected, forwards that only checked a row's
    # last block, drafts never checked (too unsure)
    wasted_forwards: list = None
    final_checks: list = None
    unchecked: list = None


@dataclass
class Step:
    """One SBD forward of record_steps=True: the block after it and what it revealed."""

    block_start: list  # per row: index of its block's first token among its generated tokens
    tokens: list  # per row (a list, or a (B, k) tensor): its block after this forward, mask_id
    revealed: list  # where still masked; and (k,) bool, the positions this forward revealed
    check: list = None  # exact SBD, per row: this forward's Check of its drafts, or None


@dataclass
class Check:
    """Exact SBD: what one forward's causal logits said of the drafts it committed (one row)."""

    start: int  # index of the first checked draft among the generated tokens
    kept: list  # the drafts NTP confirmed
    rejected: list  # the first wrong draft and every one after it
    correction: int | None  # NTP's token in place of the first wrong draft (None: all right)


# -----------------------------------------------------------------------------
# shared steps: checks, the static cache


def check_prompt(model, prompt, n_slots):
    """-> prompt as a (B, T0) long tensor on the model's device; n_slots = positions decoding
    needs past it."""
    if not torch.is_tensor(prompt):
        lengths = sorted({len(row) for row in prompt})
        if len(lengths) > 1:
            raise ValueError(f"prompts of unequal lengths {lengths}: a batch must share one length "
                             "(decode them separately, or left-pad them as evaluate.py does)")
        prompt = torch.tensor(list(prompt), dtype=torch.long)
    if prompt.dim() == 1:
        prompt = prompt[None]  # one prompt -> a batch of one
    if prompt.numel() == 0:
        raise ValueError("empty prompt: decoding needs at least one token to start from")
    if n_slots < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {n_slots}")
    if prompt.size(1) + n_slots > model.max_seq_len:
        raise ValueError(f"prompt of {prompt.size(1)} tokens + {n_slots} more positions is past "
                         f"the model's context of {model.max_seq_len}: shorten the prompt or "
                         "max_new_tokens")
    return prompt.to(next(model.parameters()).device)


def check_mask_id(model, settings):
    vocab_size = model.config.vocab_size
    if settings.mask_id is None or not 0 <= settings.mask_id < vocab_size:
        raise ValueError(f"mask id {settings.mask_id} is outside the model's vocabulary of "
                         f"{vocab_size} tokens")


def new_cache(model, prompt, n_slots, settings=None):
    """The static KV cache of a decode: room for the prompt and n_slots more (2k more for exact or
    compiled decoding). With settings.compiled, the smallest kept cache that has the room (its
    length set back to 0), else a new one rounded up to a multiple of 64 and kept: a compiled
    graph is made for one cache's shapes, so decodes of similar or shorter lengths share it (a
    2-token warm-up decode runs the graphs of the decode it warms up). Its room is checked here
    (check_prompt) once, so its forwards skip the host checks a graph cannot make."""
    B, T0 = prompt.shape
    dtype = next(model.parameters()).dtype
    if settings is not None and (settings.exact or settings.compiled):
        n_slots += 2 * settings.k  # room for exact SBD's widest forward, and a compiled width's
    if settings is None or not settings.compiled:
        cache = model.new_cache(B, T0 + n_slots, prompt.device, dtype=dtype)
    else:
        kept = CACHES.setdefault((id(next(model.parameters())), B, dtype, prompt.device), {})
        need = T0 + n_slots
        max_len = min([n for n in kept if n >= need], default=-(-need // 64) * 64)
        if max_len not in kept:
            kept[max_len] = model.new_cache(B, max_len, prompt.device, dtype=dtype)
            kept[max_len].host_checks = False
            for t in kept[max_len].k + kept[max_len].v + [kept[max_len].lengths]:
                torch._dynamo.mark_static_address(t)  # CUDA graphs write them in place
        cache, k = kept[max_len], settings.k
        # the widths its forwards are padded to, one graph each: 1 (NTP), and a block with the
        # tokens it commits (one, or a whole block)
        cache.length, cache.widths = 0, sorted({1, k + 1, 2 * k})
    cache.n_pad = getattr(model, "n_pad", None)  # tasks.solve.LeftPadded's: a step's input
    return cache


CACHES = {}  # compiled decoding's caches: (model, batch size, dtype, device) -> {max_len: cache}


# -----------------------------------------------------------------------------
# the decode step: decode.hybrid_forward on the static cache, padded, eager or compiled


def padded_forward(model, cache, tokens, n_commit, n_real):
    """decode.hybrid_forward of the first n_real tokens of tokens (B, T) -> logits (B, T, V); the
    tokens after n_real are padding that no real token sees (cache_mask), at position 0. n_commit,
    n_real: ints, or (B,) per row. With n_real = T it is hybrid_forward, logit for logit
    (tests/test_fast_decode.py); padded to a few widths, every forward of a width is one graph."""
    T = tokens.size(1)
    q = cache.next_slots(T)  # (B, T): the slots
    start = (cache.lengths + n_commit)[:, None, None]  # (B, 1, 1): the block's first slot
    end = (cache.lengths + n_real)[:, None, None]  # (B, 1, 1): the first padding slot
    mask = cache_mask(q[..., None], cache.slots, start, end)  # (B, T, max_len)
    pos = torch.where(q < end[..., 0], q, 0)  # (B, T); padding at 0 (nothing reads it)
    return model(tokens, pos=pos, mask=mask, cache=cache, n_commit=n_commit,
                 block_start=start[..., 0])[0]


def cache_mask(q, kv, block_start, end):
    """sbd.hybrid_mask over a static KV cache's slots, q (B, T, 1) a query's, kv (max_len,) a
    key's; block_start and end (B, 1, 1): the block's first slot and the first slot past the
    forward's real tokens. Keys from end on (not written yet, scratch, padding) are hidden; a
    padding query (q >= end) sees itself, so that no query sees no key (softmax of nothing is NaN,
    and a NaN value in a hidden slot would still reach p @ v)."""
    return hybrid_mask(q, kv, block_start) & (kv < end) | (kv == q)


def decode_forward(model, cache, tokens, n_commit, n_real=None):
    """Every decoding forward: hybrid_forward, or on a cache of compiled decoding (new_cache with
    settings.compiled) its compiled graph, the tokens padded to the next of cache.widths (when the
    cache has room; the padding is past n_real, hidden)."""
    widths, T = getattr(cache, "widths", None), tokens.size(1)  # widths: new_cache(.., settings)
    causal = isinstance(n_commit, int) and n_commit == T and n_real in (None, T)  # NTP, prefill
    if widths is None and causal:
        return model(tokens, cache=cache)[0]  # the model's default positions and mask
    if widths is None and n_real is None:
        return hybrid_forward(model, cache, tokens, n_commit)
    if widths is None:
        return padded_forward(model, cache, tokens, n_commit, n_real)
    B, n_real = tokens.size(0), T if n_real is None else n_real
    room = cache.max_len - (int(cache.lengths.max()) if T > 1 else 0)
    W = next((w for w in widths if T <= w <= room), T)  # a new width compiles a new graph
    as_rows = lambda n: torch.as_tensor(n, device=tokens.device).expand(B).contiguous()
    padded = tokens.new_zeros(B, W)  # (B, W), the strides of every call: no recompile
    padded[:, :T] = tokens
    logits = compiled_step(tokens.device.type)(model, cache, padded, as_rows(n_commit),
                                               as_rows(n_real))[:, :T]
    return logits.clone() if tokens.is_cuda else logits  # a CUDA graph's next replay reuses it


def warm_up(model, prompt, n_slots, settings):
    """Compile every width of a compiled decode of prompt (B, T0) and n_slots new tokens before it
    starts -> seconds (a later process finds inductor's graphs on disk)."""
    t0 = time.perf_counter()
    with torch.inference_mode():  # as the decoders: its cache is theirs
        cache = new_cache(model, prompt, n_slots, serving_settings(settings))
        for width in cache.widths:
            decode_forward(model, cache, prompt[:, :1].expand(-1, width), 1)
            cache.length = 0
    synchronize(prompt.device)
    return time.perf_counter() - t0


@functools.cache
def compiled_step(device_type):
    """torch.compile of padded_forward: static shapes (one graph per width and cache size), each
    forward one graph. On a CPU inductor, the weights frozen into the graph as constants so that
    it packs them for the CPU's matrix kernels once; on a GPU CUDA graphs (reduce-overhead): one
    replay per step instead of a kernel launch per op (gpt-fast's recipe)."""
    check_compiler(device_type)
    torch._dynamo.config.cache_size_limit = 64  # a graph per width, batch size and cache size
    if device_type == "cuda":
        return torch.compile(padded_forward, mode="reduce-overhead", fullgraph=True,
                             dynamic=False)
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(padded_forward, fullgraph=True, dynamic=False)


def cxx_compiler():
    """The C++ compiler torch.compile would use on a CPU ($CXX, g++, c++, clang++), or None."""
    names = (os.environ.get("CXX"), "g++", "c++", "clang++")
    return next((name for name in names if name and shutil.which(name)), None)


def check_compiler(device_type):
    """torch.compile on a CPU writes C++: a one-line error where no compiler is found."""
    if device_type == "cpu" and cxx_compiler() is None:
        raise ConfigError("compile=True needs a C++ compiler for torch.compile on a CPU "
                          "(apt-get install g++, or set CXX); or decode eagerly: compile=False")


def prefill(model, prompt, cache):
    """decode.prefill, timed -> (pending (B, 1), dict(prefill_forwards, prefill_time))."""
    t0 = time.perf_counter()
    pending = decode.prefill(model, prompt, cache)
    synchronize(prompt.device)
    return pending, dict(prefill_forwards=int(prompt.size(1) > 1),
                         prefill_time=time.perf_counter() - t0)


def synchronize(device):
    """Wait for the accelerator, so that a wall-clock reading includes the work queued on it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def finish(out, stop, nfe, widths, prefill_info, t0, steps=None):
    """Cut each row of out (B, N) after its first stop token -> (token lists, ServingStats)."""
    is_stop = torch.isin(out, stop)  # (B, N)
    first_stop = is_stop.int().argmax(dim=1)  # (B,): index of the first stop token (0 if none)
    lengths = torch.where(is_stop.any(dim=1), first_stop + 1, out.size(1)).tolist()  # waits
    tokens = [row[:n] for row, n in zip(out.tolist(), lengths)]
    stats = ServingStats(nfe=nfe.tolist(), tokens=lengths, widths=widths, steps=steps,
                         wall_time=time.perf_counter() - t0, **prefill_info)
    return tokens, stats


# -----------------------------------------------------------------------------
# next-token decoding: the baseline


@torch.inference_mode()
def ntp_generate(model, prompt, settings, max_new_tokens, generator=None):
    """Plain next-token decoding through the KV cache: one forward per generated token.

    prompt (B, T0), rows of equal length. After the prefill, each forward feeds the pending tokens
    (B, 1) and yields the next ones, so NFE = tokens generated. From the settings NTP uses the stop
    tokens, the mask token (never emitted; None: no mask token) and the sampling (temperature,
    top_k, top_p); k, γ and the rule are SBD's. A row is done at its first stop token; the batch
    stops when every row is done or after max_new_tokens. Returns (tokens, stats): tokens[b] = row
    b's new ids up to its first stop token.
    """
    settings = serving_settings(settings)
    prompt = check_prompt(model, prompt, max_new_tokens)
    t0 = time.perf_counter()
    cache = new_cache(model, prompt, max_new_tokens, settings)
    pending, prefill_info = prefill(model, prompt, cache)
    stop = torch.tensor(settings.stop_ids, dtype=torch.long, device=prompt.device)
    out, nfe = ntp_run(model, cache, pending, settings, stop, max_new_tokens, generator)
    return finish(out, stop, nfe, [1] * len(out[0]), prefill_info, t0)


def ntp_run(model, cache, pending, settings, stop, n, generator=None):
    """NTP's loop: up to n forwards from pending (B, 1), one token each, until every row has
    emitted one of the stop ids (a tensor) -> (tokens (B, m), nfe (B,): forwards up to its stop)."""
    out, done, nfe = [], torch.zeros_like(pending[:, 0], dtype=torch.bool), 0 * pending[:, 0]
    while len(out) < n and not done.all():
        logits = decode_forward(model, cache, pending, 1)  # (B, 1, V)
        nfe += ~done  # a row's count stops at its stop token
        pending = next_token(logits[:, -1], settings, generator)[:, None]  # (B, 1)
        out.append(pending)
        done |= torch.isin(pending[:, 0], stop)
    return (torch.cat(out, dim=1) if out else pending[:, :0]), nfe


# -----------------------------------------------------------------------------
# set block decoding (Algorithms 2 and 3)


def block_forward(model, cache, prev, block):
    """One SBD forward -> (causal logits of prev (B, n_prev, V), block logits (B, k, V)).

    Feeds [prev ; block]. prev (B, n_prev) is the pending prompt token or the previous, finished
    block: it is committed to the cache, so its logits are next-token logits, the very ones NTP
    decoding computes at those positions. Block slot i stands for the token at position
    n_cached + n_prev + i and predicts the token AT it.
    """
    n_prev = prev.size(1)
    logits = decode_forward(model, cache, torch.cat([prev, block], dim=1), n_prev)  # (B, T, V)
    return logits[:, :n_prev], logits[:, n_prev:]


def decode_block(model, cache, prev, k, active, settings, stop, generator=None):
    """Algorithm 3: fill a block of k masks for every active row; the first forward commits prev.

    Slot 0 comes from the first forward's causal logits (reveal_first; with
    settings.first_from_ntp False it is a mask like the others, the paper's way); the reveal rule
    picks among the other masked slots in that forward and in every later one (which feed the block
    alone). Forwards run until every active row's block is full or finished: a row is finished
    (finished[b] True) once its block holds a stop token with every slot before it revealed, and it
    takes no part in later forwards. Returns block (B, k), finished (B,) bool, nfe (B,) =
    forwards in which each row still had masks, and steps = [(block, revealed, width)] per forward:
    the block after it, the (B, k) slots it revealed (slot 0 included) and the tokens it fed
    (n_prev + k in the first forward, k later).
    """
    B = prev.size(0)
    block = prev.new_full((B, k), settings.mask_id)  # (B, k)
    is_masked = active[:, None].expand(B, k)  # rows already done take no part
    finished, nfe, steps = torch.zeros_like(active), torch.zeros_like(prev[:, 0]), []
    while is_masked.any():
        causal, logits = block_forward(model, cache, prev, block)  # (B, n_prev, V), (B, k, V)
        logits = block_predictions(logits, settings.token_shift)  # position i's, slot read_at(i)
        nfe += is_masked.any(dim=1)
        width, first_revealed = prev.size(1) + k, None
        if prev.size(1) and settings.first_from_ntp:  # slot 0 from the causal logits, exactly
            block, is_masked, first_revealed = reveal_first(block, is_masked, causal, settings,
                                                            generator)
        prev = prev[:, :0]  # committed: later forwards of this block feed the block alone
        block, revealed, _ = reveal_step(logits, block, is_masked, settings, generator)
        is_masked = is_masked & ~revealed
        finished = finished | stop_reached(block, is_masked, stop)
        is_masked = is_masked & ~finished[:, None]
        shown = revealed if first_revealed is None else revealed | first_revealed
        steps.append((block, shown, width))
    return block, finished, nfe, steps


@torch.inference_mode()
def sbd_generate(model, prompt, settings, max_new_tokens, generator=None, record_steps=False):
    """Set Block Decoding through the KV cache (Algorithms 2 and 3 of the paper).

    prompt (B, T0), rows of equal length. Blocks of settings.k tokens (the last one shorter if
    max_new_tokens says so) start as masks; each forward predicts every masked position and the
    reveal rule reveals some of them (decode_block). The first forward of a block feeds
    [previous block ; block] and commits the previous block causally, later ones feed the block
    alone; nothing of a block's bidirectional forwards is ever cached. Rows reveal independently:
    a row's greedy result is the same as decoding it alone (sampled rows draw from one random
    stream). A row is done once it has revealed a stop token and everything before it.
    Returns (tokens, stats): tokens[b] = row b's new ids up to and including its first stop token.
    """
    settings = serving_settings(settings)
    check_mask_id(model, settings)
    prompt = check_prompt(model, prompt, max_new_tokens)  # the last block is cut: no slack of k
    t0 = time.perf_counter()
    B = prompt.size(0)
    cache = new_cache(model, prompt, max_new_tokens, settings)
    prev, prefill_info = prefill(model, prompt, cache)
    stop = torch.tensor(settings.stop_ids, dtype=torch.long, device=prompt.device)
    done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
    blocks, nfe, widths, n_out = [], 0 * prev[:, 0], [], 0
    steps = [] if record_steps else None
    while n_out < max_new_tokens and not done.all():
        k = min(settings.k, max_new_tokens - n_out)
        block, finished, block_nfe, block_steps = decode_block(model, cache, prev, k, ~done,
                                                               settings, stop, generator)
        widths += [width for _, _, width in block_steps]
        if record_steps:
            steps += [Step([n_out] * B, tokens.cpu(), revealed.cpu())
                      for tokens, revealed, _ in block_steps]
        blocks.append(block)
        prev, done, nfe, n_out = block, done | finished, nfe + block_nfe, n_out + k
    out = torch.cat(blocks, dim=1) if blocks else prompt[:, :0]
    return finish(out, stop, nfe, widths, prefill_info, t0, steps)


# -----------------------------------------------------------------------------
# the step view: the paper's Figure 2b in a terminal


def format_steps(steps, decode, mask_id, prompt=None, row=0):
    """One row's block after each of its forwards, as text.

    Tokens revealed by that forward are shown [x], still-masked positions _, earlier reveals
    plainly. Exact SBD adds what each committing forward's check found: drafts it rejected are
    shown ~struck~ and NTP's token that replaced the first of them {in braces}.
    steps: stats.steps of a decode with record_steps=True; decode: ids -> text.
    """
    lines = [f"prompt {prompt!r}"] if prompt is not None else []
    checks = [None if s.check is None else s.check[row] for s in steps]
    taken = [(s, c) for s, c in zip(steps, checks) if s.revealed[row].any() or c is not None]
    for i, (step, check) in enumerate(taken):  # the forwards this row took part in
        cells = [format_cell(decode, t, new, mask_id)
                 for t, new in zip(step.tokens[row].tolist(), step.revealed[row].tolist())]
        start = step.block_start[row]
        text = f"tokens {start:3d}-{start + len(cells) - 1:<3d}  {''.join(cells)}" if cells else ""
        lines.append(f"forward {i + 1:3d}  {text}{format_check(check, decode)}".rstrip())
    return "\n".join(lines)


def format_cell(decode, token, newly_revealed, mask_id):
    """One block position: '_' masked, '[x]' revealed by this forward, 'x' revealed before."""
    if token == mask_id:  # revealed tokens are never the mask token (suppress_mask)
        return "_"
    text = printable(decode([token]))
    return f"[{text}]" if newly_revealed else text


def format_check(check, decode):
    """Exact SBD: what a forward's causal logits said of the drafts it committed ('' for none)."""
    if check is None or not (check.kept or check.rejected):
        return ""
    end = check.start + len(check.kept) + len(check.rejected) - 1
    where = f"checks tokens {check.start}-{end}: "
    if check.correction is None:
        return f"   {where}all {len(check.kept)} drafts right"
    kept, rejected = printable(decode(check.kept)), printable(decode(check.rejected))
    return f"   {where}{kept}{{{printable(decode([check.correction]))}}}~{rejected}~"


def printable(text):
    return text.replace("\n", "\\n")  # keep one line per forward
