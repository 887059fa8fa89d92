"""Write tests/data/old_sbd_outputs.json: what a checkpoint decodes to, to pin it across versions.

tests/data/old_sbd.pt is a 1-layer demo model that commit 6f33a97's train.py wrote, before the
checkpoint recorded token_shift (150 NTP + 150 SBD steps: config/sbd_small.py with --n_layer=1
--n_embd=32 --n_head=2 --ntp_iters=150 --sbd_iters=150 --batch_size=16 --sbd_batch_size=16
--warmup_iters=10 --report=False). This script decoded it at that commit; tests/test_token_shift.py
decodes it again with today's code and must get the same tokens.

    python tests/data/record_checkpoint_outputs.py   # only to re-pin after a deliberate change
"""

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from checkpoint import load_checkpoint, settings_for  # noqa: E402
from serving import batched  # noqa: E402
from serving.exact import exact_generate  # noqa: E402

# six test prompts of data/addition, right-aligned as in training (ids of the checkpoint's chars)
PROMPTS = ["Q:52+228=?A:", "Q:999+1=?A:", "Q:7+86=?A:", "Q:140+305=?A:", "Q:61+759=?A:",
           "Q:33+4=?A:"]
RUNS = {  # name -> (decoder, settings_for arguments)
    "ntp": ("ntp", dict(gamma=0.0)),
    "sbd_k8_gamma0.1": ("sbd", dict(k=8, gamma=0.1)),
    "sbd_k16_all": ("sbd", dict(k=16, gamma=1e9)),
    "exact_k8": ("exact", dict(k=8, gamma=1e9, exact=True)),
    "exact_k16_gamma0.1": ("exact", dict(k=16, gamma=0.1, exact=True)),
    "exact_adaptive": ("exact", dict(k=16, exact=True, adaptive=True)),
    "exact_sampled": ("exact", dict(k=8, gamma=0.1, exact=True, temperature=1.0)),
    "sbd_sampled": ("sbd", dict(k=8, gamma=0.1, temperature=1.0)),
}


def prompt_ids(checkpoint):
    chars = checkpoint["tokenizer"]["chars"]
    return [[chars.index(c) for c in p.rjust(13)] for p in PROMPTS]


def decode_all(model, checkpoint):
    """-> {run name: token lists} for every run of RUNS, all prompts in one batch."""
    prompts = torch.tensor(prompt_ids(checkpoint))
    out = {}
    for name, (decoder, args) in RUNS.items():
        settings = settings_for(checkpoint, **args)
        run = dict(ntp=batched.ntp_generate, sbd=batched.sbd_generate, exact=exact_generate)
        generator = torch.Generator().manual_seed(7)
        out[name], _ = run[decoder](model, prompts, settings, 59, generator)
    return out


if __name__ == "__main__":
    model, checkpoint = load_checkpoint(os.path.join(HERE, "old_sbd.pt"))
    with open(os.path.join(HERE, "old_sbd_outputs.json"), "w") as f:
        json.dump(decode_all(model, checkpoint), f)
    print("wrote", os.path.join(HERE, "old_sbd_outputs.json"))
