"""
Batch-1 decoding speed, measured side by side (python -m bench --what=kvcache|sbd|adaptive; the
settings and what each prints: bench/__main__.py).

kvcache: NTP through the KV cache against nanoGPT's way, a full forward of the context per token.
sbd: NTP, SBD and exact SBD through the KV cache, measured and as Eq. 16 predicts from the times of
the forwards each fed.
adaptive: exact SBD with and without the adaptive block size.
"""

import collections
import math
import os
import random
import statistics
import time

import torch

from bench.measure import cpu_name, filled_cache, forward_times, spread
from bench.workload import (
    checkpoint_path,
    decode_problems,
    load_trained,
    random_gpt,
    trained_settings,
)
from serving.batched import ntp_generate
from serving.exact import decode
from serving.settings import ServingSettings
from tasks.solve import mode_name, new_tokens

# -----------------------------------------------------------------------------
# kvcache


@torch.inference_mode()
def recompute_generate(model, prompt, max_new_tokens):
    """Greedy NTP without a cache, as nanoGPT's sampler: a full forward of the context per token."""
    idx = prompt
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.max_seq_len:])  # (1, T, V)
        idx = torch.cat([idx, logits[:, -1:].argmax(-1)], dim=1)
    return idx[:, prompt.size(1):]


def bench_kvcache(cfg):
    model = random_gpt(cfg)
    prompt = torch.randint(0, cfg.vocab_size, (1, cfg.prompt_len), device=cfg.device)
    greedy, n = ServingSettings(mask_id=None), cfg.new_tokens
    ntp_generate(model, prompt, greedy, 8)  # warm-up
    cached, stats = ntp_generate(model, prompt, greedy, n)
    t0 = time.perf_counter()
    recomputed = recompute_generate(model, prompt, n)
    t_recompute = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"GPT {cfg.n_layer}L/{cfg.n_embd}d ({params:.1f}M parameters), greedy, prompt "
          f"{cfg.prompt_len}, {n} new tokens, {torch.get_num_threads()} threads")
    print(f"KV cache:   {stats.wall_time:7.2f} s  {n / stats.wall_time:7.1f} tokens/s")
    print(f"recompute:  {t_recompute:7.2f} s  {n / t_recompute:7.1f} tokens/s")
    print(f"speed-up of the KV cache: {t_recompute / stats.wall_time:.1f}x "
          f"(same tokens: {cached[0] == recomputed[0].tolist()})")


# -----------------------------------------------------------------------------
# sbd

# a mode's decodes summed over its prompts: decode seconds (prefill excluded), tokens, forwards,
# and a Counter of the widths (tokens fed) of its forwards
Totals = collections.namedtuple("Totals", "decode_time tokens nfe widths")


def totals(stats):
    """[DecodeStats of one prompt each, batch 1] -> Totals."""
    return Totals(decode_time=sum(s.wall_time - s.prefill_time for s in stats),
                  tokens=sum(s.tokens[0] for s in stats), nfe=sum(s.nfe[0] for s in stats),
                  widths=collections.Counter(w for s in stats for w in s.widths))


def random_workload(cfg):
    """-> (random model, prompts [(1, prompt_len) tensors], plain SBD settings, exact SBD settings,
    max_new, description): k = --k or 16, γ = --gamma or random_gamma."""
    model = random_gpt(cfg)
    prompts = [torch.randint(0, cfg.vocab_size - 1, (1, cfg.prompt_len), device=cfg.device)
               for _ in range(cfg.num_prompts)]
    gamma = cfg.gamma if cfg.gamma is not None else cfg.random_gamma
    plain = ServingSettings(mask_id=cfg.vocab_size - 1, k=cfg.k or 16, gamma=gamma, rule=cfg.rule)
    print(f"no {checkpoint_path(cfg)}: a random GPT {cfg.n_layer}L/{cfg.n_embd}d, k={plain.k}, "
          f"γ={gamma:g}")
    return (model, prompts, plain, plain.replace(exact=True), cfg.max_new_tokens,
            f"random GPT {cfg.n_layer}L/{cfg.n_embd}d")


def trained_workload(cfg):
    """As random_workload, for out_dir's checkpoint: its first num_prompts test problems, the task's
    max_new_tokens (cut to what the model's context leaves the longest prompt), --gamma (when
    given) for both modes, else the calibrated γs."""
    model, task, problems, checkpoint, calibration = load_trained(cfg, cfg.num_prompts)
    prompts = [torch.tensor([task.encode_prompt(p)], device=cfg.device) for p, _ in problems]
    plain, exact = trained_settings(cfg, checkpoint, calibration, exact_gamma=cfg.gamma)
    path = checkpoint_path(cfg)
    print(f"{path}: k={exact.k}, " + (f"γ={plain.gamma:g}, " if plain else "")
          + f"exact γ={exact.gamma:g} ({'given' if cfg.gamma is not None else 'calibrated'})")
    max_new = min(new_tokens(task, model, prompt.size(1)) for prompt in prompts)
    return model, prompts, plain, exact, max_new, path


def decode_interleaved(model, prompts, modes, max_new, repeats):
    """({mode: [[DecodeStats per prompt] per repetition]}, {mode: outputs of the first}): each
    prompt decoded alone in every mode ({name: settings}; 'ntp' decodes with NTP), repeats times.
    The modes take turns prompt by prompt, so a slow moment of the machine hits them alike; one
    untimed decode per mode first (warm-up)."""
    for mode, settings in modes.items():
        decode(model, prompts[0], settings, 4, ntp=mode == "ntp")
    stats, outputs = {mode: [] for mode in modes}, {mode: [] for mode in modes}
    for rep in range(repeats):
        for mode in modes:
            stats[mode].append([])
        for prompt in prompts:
            for mode, settings in modes.items():
                out, s = decode(model, prompt, settings, max_new, ntp=mode == "ntp")
                stats[mode][rep].append(s)
                outputs[mode] += out if rep == 0 else []
    return stats, outputs


def print_against_ntp(settings, stats, ntp, t):
    """One mode's tokens, forwards and decode time (stats: per repetition, per prompt), and its
    wall clock against NTP's (per repetition, Totals): measured, median [min-max] over the
    repetitions of the ratio in each, and predicted from the forward times t {width: seconds}."""
    k, total = settings.k, totals(stats[0])
    seconds = [totals(rep).decode_time for rep in stats]
    measured = statistics.median(seconds) / total.tokens
    predicted = sum(t[w] * n for w, n in total.widths.items()) / total.tokens
    ratios = [n.decode_time / s for n, s in zip(ntp, seconds)]  # NTP's time / this mode's
    stats = stats[0]
    forwards_per_block = total.nfe / sum(math.ceil(s.tokens[0] / k) for s in stats)
    eq16 = k * t[1] / (t[2 * k] + (forwards_per_block - 1) * t[k])
    checked = ""
    if settings.exact:
        checked = (f", {sum(s.accepted[0] for s in stats)} drafts kept, "
                   f"{sum(s.rejected[0] for s in stats)} rejected")
    print(f"{mode_name(settings)} k={k} γ={settings.gamma:g}: {total.tokens} tokens in {total.nfe} "
          f"forwards ({total.tokens / total.nfe:.2f} tok/fwd, "
          f"{forwards_per_block:.2f} forwards per block{checked}), decode "
          f"{spread(seconds, 3)} s ({1000 * measured:.2f} ms/token)")
    print(f"    wall clock vs NTP: measured {spread(ratios)}x, predicted "
          f"from the forward times of the widths fed {t[1] / predicted:.2f}x (Eq. 16 with l = "
          f"{forwards_per_block:.2f}: {eq16:.2f}x); measured / predicted = "
          f"{statistics.median(ratios) / (t[1] / predicted):.2f}; time beyond the forwards: "
          f"{1000 * (measured - predicted) * total.tokens / total.nfe:.2f} ms per forward")


def bench_sbd(cfg):
    """SBD and exact SBD against NTP at batch 1, on out_dir's checkpoint or a random model, and
    the wall clock predicted from the times of a forward of every width the decodes fed."""
    workload = trained_workload if os.path.exists(checkpoint_path(cfg)) else random_workload
    model, prompts, plain, exact, max_new, description = workload(cfg)
    modes = {"ntp": exact, "exact": exact, **({"sbd": plain} if plain else {})}
    stats, outputs = decode_interleaved(model, prompts, modes, max_new, cfg.repeats)
    ntp_reps, k = [totals(rep) for rep in stats["ntp"]], exact.k
    ntp = ntp_reps[0]
    # forward times of every width the decodes fed, on a cache as long as a mid-answer context
    context = min(prompts[0].size(1) + ntp.tokens // (2 * len(prompts)),
                  model.max_seq_len - 2 * k - 1)
    widths = {1, k, 2 * k}.union(*(totals(s[0]).widths for s in stats.values()))
    t = forward_times(model, filled_cache(model, context, 2 * k + 1), sorted(widths),
                      cfg.timing_repeats)
    print(f"{description}, {len(prompts)} prompts decoded one at a time, "
          f"{torch.get_num_threads()} threads, {cfg.repeats} repetitions: median [min-max]")
    print(f"forward times on a cache of {context}: t(1) = {1000 * t[1]:.2f} ms, t({k}) = "
          f"{1000 * t[k]:.2f} ms, t({2 * k}) = {1000 * t[2 * k]:.2f} ms; "
          f"t({k})/t(1) = {t[k] / t[1]:.2f}")
    ntp_seconds = [rep.decode_time for rep in ntp_reps]
    print(f"NTP: {ntp.tokens} tokens in {ntp.nfe} forwards, decode {spread(ntp_seconds, 3)} s "
          f"({1000 * statistics.median(ntp_seconds) / ntp.tokens:.2f} ms/token)")
    for mode in (m for m in ("sbd", "exact") if m in stats):
        print_against_ntp(modes[mode], stats[mode], ntp_reps, t)
    print(f"exact SBD output == NTP output on every prompt: {outputs['ntp'] == outputs['exact']}")


# -----------------------------------------------------------------------------
# adaptive


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
    device = next(model.parameters()).device
    for ids in prompts:
        n = min(max_new, model.max_seq_len - len(ids))  # a long unfamiliar prompt leaves less room
        _, stats = decode(model, torch.tensor([ids], device=device), settings, n, ntp=ntp)
        seconds, tokens = seconds + stats.wall_time - stats.prefill_time, tokens + stats.tokens[0]
        forwards += stats.nfe[0]
    return seconds, tokens, forwards


def print_tokens_per_forward(cfg, model, task, problems, exact):
    """Tokens per forward of exact SBD with adaptive=False and True on the problems, decoded in
    batches of adaptive_batch_size, and how many outputs are NTP's."""
    ntp_out, _ = decode_problems(model, task, problems, exact, cfg.adaptive_batch_size, ntp=True)
    for adaptive in (False, True):
        out, stats = decode_problems(model, task, problems, exact.replace(adaptive=adaptive),
                                     cfg.adaptive_batch_size)
        tokens, forwards = sum(sum(s.tokens) for s in stats), sum(sum(s.nfe) for s in stats)
        same = sum(a == b for a, b in zip(out, ntp_out))
        print(f"  adaptive={adaptive!s:5}: {tokens / forwards:.2f} tokens per forward on "
              f"{len(problems)} test problems (output identical to NTP's on {same})")


def wall_clock_cases(cfg, model, task, problems):
    """[(name, model, prompts as id lists)] to time at batch 1: test problems; for the demo GPT
    also prompts unlike training's and a random model of the same shape."""
    test_prompts = [task.encode_prompt(p) for p, _ in problems[:cfg.unfamiliar_prompts]]
    cases = [("test problems", model, test_prompts)]
    if hasattr(model, "transformer"):  # the demo GPT: character prompts and a random twin
        c = model.config
        shape = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
                     block_size=c.block_size, vocab_size=c.vocab_size)
        unlike = unfamiliar(task, cfg.unfamiliar_prompts, random.Random(cfg.seed))
        cases += [("prompts unlike training's", model, unlike),
                  ("a random model, same shape", random_gpt(cfg, shape), test_prompts)]
    return cases


def print_wall_clock(name, model, prompts, exact, max_new, repeats):
    """One case's batch-1 wall clock: NTP, and exact SBD with adaptive=False and True, repeated
    and interleaved (NTP, False, True, NTP, ...) after a warm-up of each; median [min-max] of the
    seconds and of each repetition's speed against NTP's."""
    device = next(model.parameters()).device
    modes = {"NTP": (exact, True), "exact adaptive=False": (exact.replace(adaptive=False), False),
             "exact adaptive=True": (exact.replace(adaptive=True), False)}
    for settings, ntp in modes.values():
        decode(model, torch.tensor([prompts[0]], device=device), settings, 4, ntp=ntp)
    runs = {mode: [] for mode in modes}  # per repetition: (seconds, tokens, forwards)
    for _ in range(repeats):
        for mode, (settings, ntp) in modes.items():
            runs[mode].append(timed(model, prompts, settings, max_new, ntp=ntp))
    ntp_s = [seconds for seconds, _, _ in runs["NTP"]]
    line = f"  {name} ({len(prompts)}, batch 1, {repeats} repetitions): NTP {spread(ntp_s)} s"
    for mode in list(modes)[1:]:
        seconds, (_, tokens, forwards) = [r[0] for r in runs[mode]], runs[mode][0]
        speed = spread([a / b for a, b in zip(ntp_s, seconds)])
        line += (f"; {mode}: {spread(seconds)} s = {speed}x NTP's speed, "
                 f"{tokens / forwards:.2f} tok/fwd")
    print(line)


def bench_adaptive(cfg):
    """Exact SBD with the adaptive block size against without, side by side: tokens per forward on
    test problems, and batch-1 wall clock against NTP. For the demo also where drafts keep failing
    (prompts unlike training's, and a random model of the same shape)."""
    model, task, problems, checkpoint, calibration = load_trained(cfg, cfg.adaptive_problems)
    _, exact = trained_settings(cfg, checkpoint, calibration)
    print(f"{checkpoint_path(cfg)}: exact SBD k={exact.k} γ={exact.gamma:g}; {cpu_name()}, "
          f"{torch.get_num_threads()} threads, {next(model.parameters()).dtype}")
    print_tokens_per_forward(cfg, model, task, problems, exact)
    for name, case_model, prompts in wall_clock_cases(cfg, model, task, problems):
        print_wall_clock(name, case_model, prompts, exact, task.max_new_tokens, cfg.repeats)
