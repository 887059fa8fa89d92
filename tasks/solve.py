"""
Decoding many problems of a task and grading them: prompts of different lengths decode together,
left-padded (LeftPadded), and every problem gets the same token budget in every mode, so that
forward counts compare like with like. evaluate.py and the benchmarks decode problems here.
"""

import time

import torch

from configurator import ConfigError
from model import causal_mask
from serving.exact import decode

MIN_NEW_TOKENS = 16  # a prompt must leave one block of k=16 to answer in (or the task's answer)


def skip_long_prompts(task, context):
    """Drop the problems whose prompt leaves fewer than MIN_NEW_TOKENS of the model's context (or
    than the task's longest answer, if shorter), and say how many; -> {split: number skipped}. The
    others get max_new_tokens cut to what the context leaves them (new_tokens)."""
    skipped, room = {}, min(MIN_NEW_TOKENS, task.max_new_tokens)
    for split, problems in task.splits.items():
        keep = [p for p in problems if len(task.encode_prompt(p[0])) + room <= context]
        skipped[split] = len(problems) - len(keep)
        if skipped[split]:
            print(f"{task.name} {split}: skipped {skipped[split]} of {len(problems)} problems "
                  f"whose prompt is longer than the model's context ({context}) "
                  f"minus {room}")
        if not keep:
            raise ConfigError(f"{task.name}: no {split} problem fits the model's context of "
                              f"{context}")
        task.splits[split] = keep
    return skipped


def new_tokens(task, model, n_prompt):
    """max_new_tokens for a prompt of n_prompt tokens: the task's, cut so that prompt + completion
    fit the model's context. Every mode decodes a problem with the same budget, in any batch."""
    return min(task.max_new_tokens, model.max_seq_len - n_prompt)


class LeftPadded(torch.nn.Module):
    """A batch of prompts of different lengths, left-padded to one length, decoded as if each row
    were alone.

    Row b starts with n_pad[b] filler slots. Every forward hides them: its mask (the decoder's
    own, or the causal default) also forbids keys in a row's filler slots, and the position ids are
    slot - n_pad[b], so row b's tokens get the positions they have alone. In the prefill a filler
    query keeps its own key (a query that sees no key would make softmax NaN). Exact up to float
    rounding: the attention sums run over more (zero-weight) keys than they would alone.
    """

    def __init__(self, model, n_pad):
        super().__init__()
        # n_pad (B,) on the model's device; decoders put it on their cache
        # (serving.batched.new_cache), where a compiled step reads it as an input (the module's
        # would be a constant of the graph: a recompile for every batch)
        self.model, self.n_pad = model, n_pad
        self.config, self.max_seq_len, self.new_cache = (model.config, model.max_seq_len,
                                                         model.new_cache)

    def forward(self, idx, pos=None, mask=None, cache=None, n_commit=None, block_start=None):
        B, T = idx.size()
        keys = torch.arange(T, device=idx.device) if cache is None else cache.slots  # (S,)
        own = None
        if pos is None:  # the decoders' default: slot positions, each row after its own length
            pos = keys[:T] if cache is None else cache.next_slots(T)  # (B, T)
        if mask is None:  # causal, over the cache's slots
            own = keys == pos[..., None]  # (B, T, S)
            mask = causal_mask(pos[..., None], keys)
        n_pad = self.n_pad if cache is None else cache.n_pad  # (B,)
        real = torch.arange(mask.size(-1), device=idx.device) >= n_pad[:, None]  # (B, S)
        if mask.dtype == torch.bool:
            mask = mask & real[:, None, :]  # (B, T, S): no filler key
        else:  # an additive bias: -inf on filler keys
            mask = torch.where(real[:, None, :], mask, float("-inf"))
        if own is not None:
            mask = mask | own
        pos = (pos - n_pad[:, None]).clamp(min=0)  # (B, T); fillers at 0
        return self.model(idx, pos=pos, mask=mask, cache=cache, n_commit=n_commit,
                          block_start=block_start)


def batches(task, model, problems, batch_size):
    """Problems sorted by prompt length, in batches of up to batch_size that share one token
    budget, left-padded to the longest prompt -> [(indices, (B, T0) prompts, (B,) filler counts,
    max_new_tokens)]. Sorting keeps the filler few: a batch spans neighbouring prompt lengths."""
    encoded = sorted(((new_tokens(task, model, len(ids)), len(ids), i, ids)
                      for i, ids in enumerate(task.encode_prompt(p) for p, _ in problems)),
                     key=lambda e: e[:3])
    start = 0
    while start < len(encoded):
        end = start + 1
        while (end < len(encoded) and end - start < batch_size
               and encoded[end][0] == encoded[start][0]):
            end += 1
        chunk, start = encoded[start:end], end
        T0 = max(n for _, n, _, _ in chunk)
        prompts = torch.tensor([[0] * (T0 - n) + ids for _, n, _, ids in chunk])  # filler id 0
        yield ([i for _, _, i, _ in chunk], prompts, torch.tensor([T0 - n for _, n, _, _ in chunk]),
               chunk[0][0])


@torch.no_grad()
def decode_batches(model, task, problems, settings, batch_size, ntp=False):
    """Decode the problems in left-padded batches of batch_size -> yields (indices of the batch's
    problems, their output ids, the batch's DecodeStats)."""
    device = next(model.parameters()).device
    for indices, prompts, n_pad, max_new_tokens in batches(task, model, problems, batch_size):
        padded = LeftPadded(model, n_pad.to(device)) if n_pad.any() else model
        out, stats = decode(padded, prompts.to(device), settings, max_new_tokens, ntp=ntp)
        yield indices, out, stats


def solve(model, task, problems, settings, ntp=False, batch_size=250):
    """Decode and grade every problem -> dict(accuracy %, forwards, tokens, rejected, seconds,
    completions, correct: one bool per problem). settings: how to decode (serving.exact.decode;
    ntp=True: NTP decoding)."""
    completions, forwards, tokens, rejected, n_done = [None] * len(problems), 0, 0, 0, 0
    t0 = last_print = time.perf_counter()
    for indices, out, stats in decode_batches(model, task, problems, settings, batch_size, ntp):
        for i, ids in zip(indices, out):
            completions[i] = task.decode(ids)
        forwards, tokens = forwards + sum(stats.nfe), tokens + sum(stats.tokens)
        rejected, n_done = rejected + sum(stats.rejected or [0]), n_done + len(indices)
        if time.perf_counter() - last_print > 30:  # a progress line on long runs
            last_print = time.perf_counter()
            what = "NTP" if ntp else f"{mode_name(settings)} k={settings.k} γ={settings.gamma:g}"
            print(f"    {what}: {n_done}/{len(problems)} problems, {last_print - t0:.0f} s, "
                  f"~{(last_print - t0) * (len(problems) - n_done) / n_done:.0f} s to go",
                  flush=True)
    correct = [task.is_correct(c, reference) for c, (_, reference) in zip(completions, problems)]
    return dict(accuracy=100.0 * sum(correct) / len(problems), forwards=forwards, tokens=tokens,
                rejected=rejected, seconds=time.perf_counter() - t0, completions=completions,
                correct=correct)


def mode_name(settings):
    return "exact SBD" if settings.exact else "SBD"


def tokens_per_forward(r):
    return r["tokens"] / max(r["forwards"], 1)
