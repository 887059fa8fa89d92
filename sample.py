"""
Sample from a trained model: Set Block Decoding (SBD) and next-token decoding (NTP) side by side.

    python sample.py                                          # a test problem, SBD vs NTP
    python sample.py --start="Q:52+228=?A:" --show_steps=True   # the paper's Figure 2b
    python sample.py --exact=True --show_steps=True           # exact SBD: drafts checked by NTP
    python sample.py --out_dir=out-sbd-llama1b --start="Write a haiku."   # a chat model
    python sample.py --init_from=Meta-Llama-3.1-8B-Instruct --mode=ntp --start="Hi"  # as downloaded

Loads out_dir/ckpt_sbd.pt (--ckpt=ntp: ckpt_ntp.pt, or any .pt file) and decodes with the
settings its calibration chose (k, γ and the rest can be overridden), the prompt shaped as the
model was trained (--raw=True: as given). Each sample prints the text, and the tokens, decode
forwards (NFE) and wall clock of SBD against NTP on the same prompt, both through the KV cache
(the prefill is in the wall clock, not in the forwards).

The decoders are decode.py's, on the model as trained. What only serving does takes serving's path
(serving.exact.decoders, the same tokens): --compile, --weights=int8/int4, --show_steps, adaptive
blocks and the draft floor (docs/fast_decoding.md).
"""

import os
import sys
import time

import torch

from checkpoint import load_checkpoint, read_calibration, settings_for
from configurator import ConfigError, check_sample_settings, configure, pick_device, resolve_dtype
from pretrained.loading import four_bit_blocks, load_pretrained, tokenizer_of
from sampling import DecodeSettings
from serving.batched import format_steps
from serving.exact import decoders
from serving.layout import WEIGHTS
from tasks import chat_prompt, task_of_checkpoint

# -----------------------------------------------------------------------------
out_dir = "out-sbd-small"  # where train.py wrote ckpt_sbd.pt and ckpt_ntp.pt
init_from = ""  # or a model as downloaded (a Llama 3 directory, a .gguf): NTP only
ckpt = "sbd"  # 'sbd' -> out_dir/ckpt_sbd.pt, 'ntp' -> out_dir/ckpt_ntp.pt, or a .pt file
start = ""  # the prompt ('' = the task's first test problem), or FILE:path to read it from
raw = False  # True: feed the prompt as given (no right-aligning, no chat template)
mode = "both"  # 'sbd', 'ntp', or 'both': decode each sample both ways and compare
exact = False  # exact SBD: drafts checked against NTP, the output is NTP's
adaptive = False  # exact SBD: each block's size follows how many drafts survived
min_draft_prob = -1.0  # exact SBD: check drafts up to the first this unsure; -1 = calibrated
k = 0  # SBD block size; 0 = the calibrated one (16 without a calibration)
gamma = -1.0  # threshold of the reveal rule (γ, or f for 'factor'); -1 = the calibrated one
rule = ""  # 'entropy', 'confidence' (EB-Sampler), 'left', 'factor'; '' = entropy (left: exact, T>0)
temperature = 0.0  # 0 = greedy, the paper's setting; > 0 samples
top_k = 0  # with temperature > 0: sample among the top_k most likely tokens only (0 = all)
top_p = 1.0  # with temperature > 0: sample among the smallest set holding top_p of the mass
max_new_tokens = 256  # stop here if no stop token came
num_samples = 1
seed = 1337
show_steps = False  # print the SBD block after every forward ([x] = just revealed, _ = masked)
device = ""  # '' = the best there is: cuda -> mps -> cpu
dtype = "float32"  # 'bfloat16' or 'auto' (bf16 where native): faster, and bf16 rounds apart
compile = None  # True: torch.compile's graphs, one per width; None: auto, for 10M+ parameters
weights = "auto"  # 'trained', 'int8', 'int4' (a GGUF file's 4-bit blocks); 'auto': int4 if any
quantized_rows = 1  # int8/int4 kernels for forwards of up to this many rows (wider: dense)
check_sample_settings(configure(globals(), sys.argv[1:]), WEIGHTS)  # one line per bad setting
# -----------------------------------------------------------------------------

device = pick_device(device)
torch.manual_seed(seed)
task = None
if init_from:  # a Llama as downloaded: never trained with the mask token, so NTP decoding only
    if mode != "ntp":
        raise ConfigError("init_from loads a model as downloaded, which has no SBD training: "
                          "use --mode=ntp, or --out_dir of an SBD run")
    model, tokenizer = load_pretrained(init_from, device,
                                       getattr(torch, resolve_dtype(dtype, device)))
    settings = DecodeSettings(mask_id=tokenizer.mask_id, stop_ids=tokenizer.stop_ids)
else:
    path = ckpt if ckpt.endswith(".pt") else os.path.join(out_dir, f"ckpt_{ckpt}.pt")
    model, checkpoint = load_checkpoint(path, device)
    if mode != "ntp" and checkpoint["stage"] != "sbd":
        raise ConfigError(f"{path} is an NTP model: use --mode=ntp, or the SBD checkpoint")
    tokenizer = tokenizer_of(checkpoint["tokenizer"])
    if checkpoint["tokenizer"]["kind"] == "char":  # a data/ task: it knows its prompt format
        task = task_of_checkpoint(checkpoint, path) if not (start and raw) else None
    model = model.to(getattr(torch, resolve_dtype(dtype, device)))
    sampling = dict(rule=rule or ("left" if exact and temperature > 0 else "entropy"),
                    temperature=temperature, top_k=top_k or None,
                    top_p=top_p if top_p < 1 else None, adaptive=adaptive)
    if mode == "ntp":
        settings = settings_for(checkpoint, gamma=0.0, **sampling)
    else:
        calibration = read_calibration(path, checkpoint)
        floor = {} if min_draft_prob < 0 else dict(min_draft_prob=min_draft_prob)
        settings = settings_for(checkpoint, calibration, k=k or None,
                                gamma=None if gamma < 0 else gamma, exact=exact, **sampling,
                                **floor)

if start.startswith("FILE:"):
    with open(start[5:], encoding="utf-8") as f:
        start = f.read()
if not start and task is None:
    raise ConfigError("no prompt: pass --start (only the checkpoint of a data/ task, "
                      "whose prompts have a known format, takes its first test problem)")
if not start:
    start = task.splits["test"][0][0]
    print(f"prompt: the first test problem of {task.name} (--start=... to give your own)")
if raw:
    ids = tokenizer.encode(start)
else:
    if task is not None:
        ids, note = task.shape_prompt(start)
    else:
        ids, note = chat_prompt(tokenizer, start), "inside the chat template (--raw=True: as given)"
    if note:
        print(f"prompt {note}")
prompt = torch.tensor([ids], device=device)  # (1, T0)
room = model.max_seq_len - prompt.size(1)  # positions left in the model's context
if room < 1:
    raise ConfigError(f"the prompt has {prompt.size(1)} tokens; the context is {model.max_seq_len}")
if max_new_tokens > room:
    print(f"max_new_tokens {max_new_tokens} -> {room}: the model's context is {model.max_seq_len}")
    max_new_tokens = room
generator = torch.Generator(device).manual_seed(seed)

# the decoders: decode.py's on the model as trained, or serving's where a setting needs them
model, settings, decode_sbd, decode_ntp = decoders(
    model, settings, prompt, max_new_tokens, compile, weights, quantized_rows,
    four_bit_blocks(init_from or checkpoint), as_loaded=bool(init_from), record_steps=show_steps)
# warm both paths up, so that the first sample's wall clock does not pay for lazy setup
for warm in {"sbd": [decode_sbd], "ntp": [decode_ntp], "both": [decode_sbd, decode_ntp]}[mode]:
    warm(model, prompt, settings, 2, generator=generator)


shown = tokenizer.decode(ids) if raw else start
name = "exact SBD" if settings.exact else "SBD"
for i in range(num_samples):
    print(f"---------- sample {i + 1}")
    if mode != "ntp":
        t0 = time.perf_counter()  # the decoders' tokens come back as ints: the device is done
        sbd_out, s = decode_sbd(model, prompt, settings, max_new_tokens, generator=generator)
        sbd_seconds = time.perf_counter() - t0
        print(shown + tokenizer.decode(sbd_out[0]))
    if mode != "sbd":
        t0 = time.perf_counter()
        ntp_out, n = decode_ntp(model, prompt, settings, max_new_tokens, generator=generator)
        ntp_seconds = time.perf_counter() - t0
        if mode == "both" and ntp_out[0] != sbd_out[0]:
            print("NTP decoding of the same prompt gives:")
        if mode == "ntp" or ntp_out[0] != sbd_out[0]:
            print(shown + tokenizer.decode(ntp_out[0]))
    if mode == "ntp":
        print(f"NTP: {n.tokens[0]} tokens in {n.nfe[0]} forwards; wall {ntp_seconds:.2f} s "
              f"({n.tokens[0] / ntp_seconds:.1f} tok/s)")
        continue
    checked = f", {s.accepted[0]} drafts kept, {s.rejected[0]} rejected" if settings.exact else ""
    line = (f"{name} k={settings.k} γ={settings.gamma:g}: {s.tokens[0]} tokens in {s.nfe[0]} "
            f"forwards ({s.tokens[0] / s.nfe[0]:.2f} tok/fwd{checked}); wall {sbd_seconds:.2f} s "
            f"({s.tokens[0] / sbd_seconds:.1f} tok/s)")
    if mode == "both":
        line += (f" vs NTP {n.nfe[0]} forwards, {ntp_seconds:.2f} s "
                 f"({ntp_seconds / sbd_seconds:.1f}x)")
    print(line)
    if show_steps:
        print(format_steps(s.steps, tokenizer.decode, settings.mask_id))
