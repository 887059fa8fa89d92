"""bench/profile.py (python -m bench --what=profile): the per-forward split adds up to the decode's
wall time, counts what it should, and leaves every wrapped function as it found it."""

import torch

import model as model_lib
from bench.profile import TARGETS, Probe, profile_mode
from sampling import DecodeSettings
from serving import batched, exact
from tiny_models import random_model


def test_profile_adds_up_and_restores_what_it_wraps():
    m = random_model("gpt-tiny")
    originals = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in TARGETS]
    call = type(m).__dict__.get("__call__")
    prompts = [torch.randint(0, 60, (1, 6), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    settings = DecodeSettings(mask_id=63, k=4, gamma=1.0)
    rows = {mode: profile_mode(m, prompts, s, 12, ntp) for mode, (s, ntp) in
            {"ntp": (settings, True), "sbd": (settings, False),
             "exact": (settings.replace(exact=True), False)}.items()}
    for row in rows.values():
        parts = row["model"] + row["cache"] + row["masks"] + row["syncs"] + row["bookkeeping"]
        assert abs(parts - row["total"]) < 1e-9 and row["forwards"] == row["nfe"]
        assert row["ops"]["model"] > 0 and row["n_syncs"] >= 1  # the loop's control-flow sync
    assert rows["ntp"]["forwards"] == 24  # its mask: a causal row over the static cache
    assert rows["ntp"]["ops"].get("masks", 0) <= 6
    assert [(owner, name, owner.__dict__.get(name)) for owner, name, _ in TARGETS] == originals
    assert type(m).__dict__.get("__call__") is call
    assert exact.prefill is batched.prefill and batched.prefill.__module__ == "serving.batched"
    assert model_lib.KVCache.extend.__qualname__ == "KVCache.extend"


def test_probe_counts_nested_time_once():
    probe = Probe()
    inner = probe.wrap("cache", lambda: sum(range(1000)))
    outer = probe.wrap("model", lambda: [inner() for _ in range(3)])
    outer()
    assert probe.calls == {"model": 1, "cache": 3}
    assert probe.seconds["model"] >= 0 and probe.seconds["cache"] > 0
