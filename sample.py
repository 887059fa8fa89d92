"""
Sample from a trained model with next-token decoding (NTP), Set Block Decoding (SBD), or both side by side.

    python sample.py --out_dir=out-sbd-small --start=" Q:52+228=?A:"            # SBD and NTP, compared
    python sample.py --out_dir=out-sbd-small --show_steps=True --num_samples=1  # the paper's Figure 2b
    python sample.py --out_dir=out-sbd-small --verify=True --show_steps=True    # exact SBD: drafts checked by NTP
    python sample.py --out_dir=out-sbd-llama8b --start="Write a haiku."          # an SBD-tuned Llama (chat format)
    python sample.py --init_from=Meta-Llama-3.1-8B-Instruct --mode=ntp --start="Hi"  # a Llama as downloaded

Loads out_dir/ckpt_sbd.pt (or ckpt_ntp.pt with --ckpt=ntp, or any file: --ckpt=path/to/ckpt.pt), written by
train.py. With --verify=True SBD runs in its exact mode (greedy, batch 1): every drafted token is checked by the
causal logits of the forward that commits it, so the text is NTP's, token for token. For every sample it prints
the text and one summary line: tokens, decode forwards (NFE) and wall clock of SBD against NTP decoding of
the same model and prompt, both through the KV cache. Both decoders prefill prompt[:-1] with one causal
forward that is not counted in the NFE (see the decoding section of sbd.py).
"""

import os
import sys

import torch

from configurator import configure
from load_llama import load_llama
from model import autodetect_device, load_checkpoint
from sbd import format_steps, ntp_generate, sbd_generate
from tokenizer import CharTokenizer, Llama3Tokenizer

# -----------------------------------------------------------------------------
out_dir = "out-sbd-small"  # where train.py wrote ckpt_sbd.pt and ckpt_ntp.pt
init_from = ""  # or a Llama 3 directory as downloaded (Meta or HF layout): an NTP model, so mode=ntp
ckpt = "sbd"  # 'sbd' -> out_dir/ckpt_sbd.pt, 'ntp' -> out_dir/ckpt_ntp.pt (mode=ntp only), or a .pt file
start = "\n"  # the prompt, or FILE:path to read it from a file
mode = "both"  # 'sbd', 'ntp', or 'both': decode each sample both ways and compare
k = None  # SBD block size; None = the checkpoint's (16 in the paper)
gamma = None  # threshold of the reveal rule (γ, or f for 'factor'); None = the checkpoint's calibrated one
verify = False  # exact SBD: drafts checked against greedy NTP, output == NTP's (temperature 0, one prompt)
rule = "entropy"  # 'entropy' or 'confidence' (EB-Sampler), 'factor' (Fast-dLLM)
temperature = 0.0  # 0 = greedy, the paper's setting; > 0 samples
top_k = None  # with temperature > 0: sample among the top_k most likely tokens only
max_new_tokens = 256  # stop here if no stop token came
num_samples = 3
seed = 1337
stop = None  # stop token ids, e.g. [0]; None = the checkpoint's
show_steps = False  # print the SBD block after every forward ([x] = just revealed, _ = masked)
device = autodetect_device()  # cuda -> mps -> cpu
configure(globals(), sys.argv[1:])
# -----------------------------------------------------------------------------

if mode not in ("sbd", "ntp", "both"):
    raise SystemExit(f"mode must be 'sbd', 'ntp' or 'both', got {mode!r}")
torch.manual_seed(seed)
if init_from:  # never trained with the mask token: NTP decoding only (it still never emits the mask token)
    model, found = load_llama(init_from, device, torch.bfloat16 if device.startswith("cuda") else None)
    path, checkpoint = init_from, dict(sbd=None, tokenizer=dict(kind="llama", path=found["tokenizer_path"]))
else:
    path = ckpt if ckpt.endswith(".pt") else os.path.join(out_dir, f"ckpt_{ckpt}.pt")  # a file, or a short name
    if ckpt.endswith(".pt") and not os.path.exists(path) and os.path.exists(os.path.join(out_dir, ckpt)):
        path = os.path.join(out_dir, ckpt)  # a file name inside out_dir
    model, checkpoint = load_checkpoint(path, device)
info = checkpoint.get("sbd")  # None for an NTP-only model
if mode != "ntp" and info is None:
    raise SystemExit(f"{path} is not an SBD model (its 'sbd' entry is None): use --mode=ntp, "
                     "or the SBD checkpoint (--ckpt=sbd)")
if checkpoint["tokenizer"]["kind"] == "llama":  # the prompt is a user message in Llama 3.1's chat format
    if checkpoint["tokenizer"]["path"] is None:
        raise SystemExit(f"{path}: no tokenizer.model next to the weights (or under original/)")
    tokenizer = Llama3Tokenizer(checkpoint["tokenizer"]["path"])
    encode = lambda text: tokenizer.encode_chat([{"role": "user", "content": text}])  # noqa: E731
    info = {"stop_ids": tokenizer.stop_ids, "mask_id": tokenizer.mask_id, **(info or {})}  # 128001/8/9, 128002
    model = model.to(torch.bfloat16) if device.startswith("cuda") else model  # FSDP checkpoints hold fp32
else:
    tokenizer = CharTokenizer(checkpoint["tokenizer"]["chars"])
    encode = tokenizer.encode

info = info or {}
k = k or info.get("k") or 16
if gamma is None and verify:  # evaluate.py stores, per k, the exact mode's fastest γ and the γ_low/γ_high pair
    gamma = info.get("gamma_exact", {}).get(str(k))
elif gamma is None:
    gamma = info.get("gammas", {}).get(str(k), [info.get("gamma_low")])[0]
    if gamma is None and "gamma_exact" in info:  # no γ kept this k within budget on val: decode exactly
        gamma, verify = info["gamma_exact"][str(k)], True
        print(f"no γ of k={k} stayed within the accuracy budget on val: exact SBD (verify=True), γ={gamma:g}")
if gamma is None and mode != "ntp":
    gamma = 0.01  # tiny models need a far lower γ than the paper's (FINDINGS.md); evaluate.py calibrates one
    print(f"the checkpoint has no calibrated γ (run evaluate.py); using γ={gamma}")
stop_ids = info.get("stop_ids", []) if stop is None else list(stop)
mask_id = info.get("mask_id")  # NTP decoding never emits it either

if start.startswith("FILE:"):
    with open(start[5:], encoding="utf-8") as f:
        start = f.read()
unknown = sorted(set(start) - set(tokenizer.chars)) if isinstance(tokenizer, CharTokenizer) else []
if unknown:
    raise SystemExit(f"the prompt has characters outside the model's vocabulary: {unknown}")
prompt = torch.tensor([encode(start)], device=device)  # (1, T0)
room = model.max_seq_len - prompt.size(1)  # positions left in the model's context
if room < 1:
    raise SystemExit(f"the prompt has {prompt.size(1)} tokens; the model's context is {model.max_seq_len}")
if max_new_tokens > room:
    print(f"max_new_tokens {max_new_tokens} -> {room}: the model's context is {model.max_seq_len} tokens")
    max_new_tokens = room
generator = torch.Generator(device).manual_seed(seed)
sbd_args = dict(k=k, gamma=gamma, rule=rule, mask_id=mask_id, stop_ids=stop_ids, temperature=temperature,
                top_k=top_k, generator=generator, verify=verify)
ntp_args = dict(stop_ids=stop_ids, temperature=temperature, top_k=top_k, generator=generator, mask_id=mask_id)

# warm up both paths, so that the first sample's wall clock is not the one that pays for lazy setup
if mode != "ntp":
    sbd_generate(model, prompt, max_new_tokens=2, **sbd_args)
if mode != "sbd":
    ntp_generate(model, prompt, 2, **ntp_args)

for i in range(num_samples):
    print(f"---------- sample {i + 1}")
    if mode != "ntp":
        sbd_out, s = sbd_generate(model, prompt, max_new_tokens=max_new_tokens, record_steps=show_steps,
                                  **sbd_args)
        print(start + tokenizer.decode(sbd_out[0]))
    if mode != "sbd":
        ntp_out, n = ntp_generate(model, prompt, max_new_tokens, **ntp_args)
        if mode == "both" and ntp_out[0] != sbd_out[0]:
            print("NTP decoding of the same prompt gives:")
        if mode == "ntp" or ntp_out[0] != sbd_out[0]:
            print(start + tokenizer.decode(ntp_out[0]))
    name = "exact SBD" if verify else "SBD"
    checked = f", {s.accepted[0]} drafts kept, {s.rejected[0]} rejected" if verify and mode != "ntp" else ""
    sbd_line = (f"{name} k={k} γ={gamma:g}: {s.tokens[0]} tokens in {s.nfe[0]} forwards "
                f"({s.tokens_per_forward[0]:.2f} tok/fwd{checked})") if mode != "ntp" else ""
    if mode == "both":
        print(f"{sbd_line} vs NTP {n.nfe[0]} forwards; wall {s.wall_time:.2f} s vs {n.wall_time:.2f} s "
              f"({n.wall_time / s.wall_time:.1f}x)")
    elif mode == "sbd":
        print(f"{sbd_line}; wall {s.wall_time:.2f} s")
    else:
        print(f"NTP: {n.tokens[0]} tokens in {n.nfe[0]} forwards; wall {n.wall_time:.2f} s")
    if show_steps and mode != "ntp":
        print(format_steps(s.steps, tokenizer.decode, mask_id))
