"""
Where a decode forward's wall clock goes (python -m bench --what=profile; the settings:
bench/__main__.py): NTP, plain SBD, exact SBD and adaptive exact SBD decode --what=sbd's workload
(out_dir's checkpoint if present, else a random model) at batch 1, and each decode forward's time is
split into

  model        the model's forward, minus the parts below that run inside it
  cache        KV cache updates (KVCache extend, commit, truncate, forget)
  masks        mask building (dense_mask, over_the_cache, attention_bias, cache_mask as the
               decode step calls it)
  syncs        host syncs: Tensor.item, tolist, bool(tensor), int(tensor), float(tensor)
  bookkeeping  the rest of the decode's wall clock: the decoders' own Python and small tensor ops

Nothing in the decoders changes: for the duration of a profile, timing wrappers are installed on
those functions and methods from the outside (monkeypatching) and removed after. Each wrapper
counts its time minus that of wrappers nested in it, so the columns add up to the decode wall time
(prefill excluded). A second, untimed pass counts per forward the aten ops each part dispatches
(a TorchDispatchMode) and the sync ops among them (_local_scalar_dense, item, nonzero, is_nonzero:
boolean indexing and isin(...).any() in an `if` included): counts do not depend on the machine's
load, so they compare before and after a change when timings are noisy. The wrappers cost time too
(about `probe` per forward, measured on an empty wrapped call); it falls mostly into bookkeeping.
"""

import collections
import os
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import decode
import model as model_lib
from bench.decode_speed import random_workload, trained_workload
from bench.measure import cpu_name
from bench.workload import checkpoint_path
from serving import batched, exact

CATEGORIES = ("model", "cache", "masks", "syncs")
SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "is_nonzero"}
# (owner, attribute, category); owners missing an attribute (another version of the code) are
# skipped, so that one profile compares before and after a change
TARGETS = [
    (model_lib.KVCache, "extend", "cache"), (model_lib.KVCache, "commit", "cache"),
    (model_lib.KVCache, "truncate", "cache"), (model_lib.KVCache, "forget", "cache"),
    (batched, "cache_mask", "masks"), (decode, "hybrid_mask", "masks"),
    (model_lib, "over_the_cache", "masks"),
    (model_lib, "attention_bias", "masks"),
    (torch.Tensor, "item", "syncs"), (torch.Tensor, "tolist", "syncs"),
    (torch.Tensor, "__bool__", "syncs"), (torch.Tensor, "__int__", "syncs"),
    (torch.Tensor, "__float__", "syncs"),
]


class Probe:
    """Timing wrappers and what they measured: exclusive seconds and calls per category."""

    def __init__(self):
        self.seconds, self.calls = collections.Counter(), collections.Counter()
        self.ops, self.sync_ops = collections.Counter(), 0  # aten ops per category (count pass)
        self.stack = []  # open wrapped calls: [category, seconds of wrapped calls nested in it]
        self.paused = False  # in the prefill: nothing counts
        self.patched = []

    def wrap(self, category, fn):
        def timed(*args, **kwargs):
            if self.paused:
                return fn(*args, **kwargs)
            frame = [category, 0.0]
            self.stack.append(frame)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                self.stack.pop()
                self.seconds[category] += elapsed - frame[1]
                self.calls[category] += 1
                if self.stack:
                    self.stack[-1][1] += elapsed
        return timed

    def install(self, model):
        """Wrap every target, the model's class call ('model') and the prefill (paused)."""
        targets = TARGETS + [(type(model), "__call__", "model")]
        for owner, name, category in targets:
            if hasattr(owner, name):
                self.patch(owner, name, self.wrap(category, getattr(owner, name)))
        for module in (batched, exact):
            self.patch(module, "prefill", self.unpaused(module.prefill))

    def unpaused(self, fn):
        def paused(*args, **kwargs):
            self.paused = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused = False
        return paused

    def patch(self, owner, name, value):
        self.patched.append((owner, name, owner.__dict__.get(name)))  # None: inherited
        setattr(owner, name, value)

    def remove(self):
        for owner, name, original in reversed(self.patched):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self.patched = []


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched, per category of the innermost open wrapper."""

    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        p = self.probe
        if not p.paused:
            p.ops[p.stack[-1][0] if p.stack else "bookkeeping"] += 1
            p.sync_ops += func.overloadpacket.__name__ in SYNC_OPS
        return func(*args, **(kwargs or {}))


def decode_all(model, prompts, settings, max_new, ntp):
    """Decode every prompt alone -> (decode seconds, prefill excluded; forwards; tokens)."""
    seconds = forwards = tokens = 0
    for prompt in prompts:
        t0 = time.perf_counter()
        _, stats = exact.decode(model, prompt, settings, max_new, ntp=ntp)
        seconds += time.perf_counter() - t0 - stats.prefill_time
        forwards, tokens = forwards + stats.nfe[0], tokens + stats.tokens[0]
    return seconds, forwards, tokens


def profile_mode(model, prompts, settings, max_new, ntp):
    """One mode's profile: a timed pass, then a counting pass -> a dict of per-forward figures."""
    decode_all(model, prompts[:1], settings, 8, ntp)  # warm-up, unwrapped
    probe = Probe()
    probe.install(model)
    try:
        seconds, forwards, tokens = decode_all(model, prompts, settings, max_new, ntp)
        timed = probe.seconds.copy(), probe.calls.copy()
        with OpCounter(probe):
            decode_all(model, prompts, settings, max_new, ntp)
    finally:
        probe.remove()
    times, calls = timed
    n_fwd = calls["model"]  # decode forwards only: the prefill's were paused
    row = {c: times[c] / n_fwd for c in CATEGORIES}
    row["bookkeeping"] = seconds / n_fwd - sum(row.values())
    row.update(total=seconds / n_fwd, forwards=n_fwd, tokens=tokens, nfe=forwards,
               n_syncs=calls["syncs"] / n_fwd, sync_ops=probe.sync_ops / n_fwd,
               ops_outside=sum(v for c, v in probe.ops.items() if c != "model") / n_fwd,
               ops={c: v / n_fwd for c, v in probe.ops.items()},
               probe=probe_cost() * sum(calls.values()) / n_fwd)
    return row


def probe_cost(n=1000, rounds=5):
    """Seconds one wrapped call adds (an empty function, wrapped as the targets are), the best of
    a few rounds: another job on the core only ever adds."""
    probe, bare = Probe(), lambda: None
    fn = probe.wrap("x", bare)
    probe.stack.append(["outer", 0.0])
    costs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        for _ in range(n):
            bare()
        costs.append((t1 - t0) - (time.perf_counter() - t1))
    return max(min(costs), 0.0) / n


def print_table(rows):
    """One line per mode, the same columns for each: microseconds per decode forward and share."""
    parts = (*CATEGORIES, "bookkeeping")
    print(f"{'mode':<22}{'fwd':>6}{'tok/fwd':>8}{'us/fwd':>8}"
          + "".join(f"{p:>15}" for p in parts)
          + f"{'syncs/fwd':>10}{'sync ops':>9}{'ops out':>8}{'probe':>7}")
    for name, r in rows.items():
        cells = "".join(f"{1e6 * r[p]:8.0f} ({100 * r[p] / r['total']:3.0f}%)" for p in parts)
        print(f"{name:<22}{r['forwards']:6d}{r['tokens'] / r['nfe']:8.2f}{1e6 * r['total']:8.0f}"
              f"{cells}{r['n_syncs']:10.2f}{r['sync_ops']:9.2f}{r['ops_outside']:8.1f}"
              f"{1e6 * r['probe']:7.0f}")
    print("aten ops per forward by part: " + "; ".join(
        f"{name}: " + ", ".join(f"{c} {v:.1f}" for c, v in sorted(r["ops"].items()))
        for name, r in rows.items()))


def bench_profile(cfg):
    """The per-forward profile of NTP, plain SBD, exact SBD and adaptive exact SBD at batch 1."""
    workload = trained_workload if os.path.exists(checkpoint_path(cfg)) else random_workload
    model, prompts, plain, exact_settings, max_new, description = workload(cfg)
    modes = {"NTP": (exact_settings, True)}
    if plain:
        modes[f"SBD k={plain.k} γ={plain.gamma:g}"] = (plain, False)
    modes[f"exact SBD k={exact_settings.k}"] = (exact_settings, False)
    modes["exact SBD adaptive"] = (exact_settings.replace(adaptive=True), False)
    print(f"{description}, {len(prompts)} prompts one at a time; {cpu_name()}, "
          f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f} "
          "(one pass: the seconds are as noisy as the machine, the op counts are not)")
    rows = {name: profile_mode(model, prompts, settings, max_new, ntp)
            for name, (settings, ntp) in modes.items()}
    print("per decode forward: microseconds (share of the decode wall time); syncs/fwd: Python-"
          "level syncs; sync ops: aten sync ops; ops out: aten ops outside the model's forward; "
          "probe: the wrappers' own cost (in the columns)")
    print_table(rows)
