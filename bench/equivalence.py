"""
Decoders' outputs, pinned: decode the same prompts in every mode and save (or compare) tokens,
DecodeStats (timings left out) and recorded steps, so that a change meant to be speed-only can be
shown to change nothing.

    python bench/equivalence.py save /tmp/new.pkl
    PYTHONPATH=/tmp/head_tree python bench/equivalence.py save /tmp/head.pkl  # another checkout
    python bench/equivalence.py compare /tmp/head.pkl /tmp/new.pkl

Run as a script, not with -m: it imports the decoders by name, so PYTHONPATH picks the checkout.
The workload: random demo-shaped GPTs (4 layers, 128 wide, vocab 32; weights at the default init
and drawn wider, so that drafts are both mostly rejected and often kept), 50 prompts at batch 1
and in batches of 10, NTP, plain SBD (k=16, three γ) and exact SBD (k=16, adaptive False/True,
temperature 0 and 1 with a seeded generator).
"""

import dataclasses
import pickle
import sys

import torch

from pretrained.shapes import build_model
from serving.exact import decode
from serving.settings import ServingSettings

SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=160, vocab_size=32)
MASK, STOP = 31, 30


def demo_model(std, seed):
    """A random demo-shaped GPT; std None keeps the default init, else matrices ~ N(0, std)."""
    torch.manual_seed(seed)
    model = build_model("gpt", **SHAPE).eval()
    if std is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std)
    return model


def modes():
    """{name: (settings, ntp)} of every decode mode pinned."""
    base = ServingSettings(mask_id=MASK, stop_ids=(STOP,), k=16)
    out = {"ntp": (base, True), "ntp_t1": (base.replace(temperature=1.0), True)}
    for gamma in (0.0, 0.5, 16.0):
        out[f"sbd_g{gamma}"] = (base.replace(gamma=gamma), False)
    out["sbd_t1"] = (base.replace(gamma=2.0, temperature=1.0), False)
    for adaptive in (False, True):
        exact = base.replace(exact=True, gamma=1.0, adaptive=adaptive)
        out[f"exact_a{adaptive}"] = (exact, False)
        out[f"exact_a{adaptive}_t1"] = (exact.replace(temperature=1.0, rule="left"), False)
    return out


def plain(value):
    """Tensors -> lists, dataclasses -> dicts, recursively: something pickle and == compare."""
    if torch.is_tensor(value):
        return value.tolist()
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def record(tokens, stats):
    fields = plain(stats)
    fields.pop("wall_time"), fields.pop("prefill_time")
    return dict(ids=tokens, **fields)


def run_all(n_prompts=50, max_new=64, batch=10):
    results = {}
    for name, std, seed in (("default", None, 1), ("wide", 0.08, 2)):
        model = demo_model(std, seed)
        prompts = torch.randint(0, 30, (n_prompts, 12), generator=torch.Generator().manual_seed(7))
        for mode, (settings, ntp) in modes().items():
            g = torch.Generator().manual_seed(123)
            for i in range(n_prompts):  # batch 1, steps recorded on a few
                out = decode(model, prompts[i:i + 1], settings, max_new, ntp=ntp, generator=g,
                             record_steps=i < 5)
                results[name, mode, 1, i] = record(*out)
            for i in range(0, n_prompts, batch):
                out = decode(model, prompts[i:i + batch], settings, max_new, ntp=ntp, generator=g,
                             record_steps=i == 0)
                results[name, mode, batch, i] = record(*out)
    return results


def compare(a, b):
    differ = [key for key in a if a[key] != b.get(key)]
    print(f"{len(a)} decodes, {len(differ)} differ" + ("" if set(a) == set(b) else ", keys differ"))
    for key in differ[:10]:
        fields = [f for f in a[key] if a[key][f] != b[key].get(f)]
        print(f"  {key}: {fields}")
    return not differ and set(a) == set(b)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "save":
        with open(sys.argv[2], "wb") as f:
            pickle.dump(run_all(), f)
    else:
        with open(sys.argv[2], "rb") as f, open(sys.argv[3], "rb") as g:
            sys.exit(0 if compare(pickle.load(f), pickle.load(g)) else 1)
