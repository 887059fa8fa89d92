"""
GPU check of the Llama path against an independent reference: Hugging Face transformers' own
LlamaForCausalLM. Builds a random model with Llama-3.2-1B's shapes (tied embeddings, llama3 rope
scaling factor 32), saves it with save_pretrained (transformers 5.x: config.json with
rope_parameters, no lm_head.weight), loads it with our load_llama and compares logits (fp32) and
greedy decoding (our ntp_generate vs HF generate, and exact SBD). Also writes a tokenizer.model with
Llama 3's 128000 ranks (bytes, byte pairs, byte triples: the special tokens get their real ids) and
tiny pairs/benchmark JSONL files for the pipeline run (gpu/check.sh). Run from the repository root.

    python gpu/check_against_transformers.py DIR [1b|tiny]   (tiny: a CPU dry run; transformers 5.x)
"""
import base64
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.getcwd())
from pretrained.load_llama import load_llama
from sampling import DecodeSettings
from serving import batched
from serving.exact import exact_generate

out_dir = sys.argv[1]
preset = sys.argv[2] if len(sys.argv) > 2 else "1b"
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if preset == "1b":
    shapes = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8)
else:
    shapes = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
config = transformers.LlamaConfig(
    vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
    bos_token_id=128000, eos_token_id=[128001, 128008, 128009], hidden_act="silu",
    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=8192), **shapes)
torch.manual_seed(0)
t0 = time.time()
with torch.device(device):
    hf = transformers.LlamaForCausalLM(config)
hf.to(torch.bfloat16).save_pretrained(out_dir)  # bf16 on disk, as the real checkpoints
os.makedirs(os.path.join(out_dir, "original"), exist_ok=True)
# a tokenizer.model with Llama 3's 128000 ranks (the 256 bytes, every byte pair, then byte triples),
# so the special tokens have their real ids (mask 128002, <|eot_id|> 128009); the real vocabulary is
# not needed here
pieces = [bytes([b]) for b in range(256)] + [bytes([a, b]) for a in range(256) for b in range(256)]
pieces += [bytes([a, b, c]) for a in range(32, 127) for b in range(32, 127)
           for c in range(32, 127)][:128000 - len(pieces)]
with open(os.path.join(out_dir, "original", "tokenizer.model"), "w") as f:
    f.write("".join(f"{base64.b64encode(p).decode()} {i}\n" for i, p in enumerate(pieces)))
cfg = json.load(open(os.path.join(out_dir, "config.json")))
print(f"saved {out_dir} in {time.time() - t0:.1f}s with transformers {transformers.__version__}: "
      f"config keys {sorted(k for k in cfg if 'rope' in k or 'tie' in k)}, "
      f"files {sorted(os.listdir(out_dir))}")
del hf

hf = transformers.LlamaForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
ours, info = load_llama(out_dir, device, torch.float32)
ours.eval()
print(f"ours: {info['format']} layout, "
      f"tied head: {ours.output.weight is ours.tok_embeddings.weight}, "
      f"{sum(p.numel() for p in ours.parameters()):,} parameters")
g = torch.Generator().manual_seed(1)
idx = torch.randint(0, 128000, (2, 1024), generator=g).to(device)
with torch.no_grad():
    ref = hf(idx).logits.float()
    got, _ = ours(idx)
err = (got - ref).abs().max().item()
print(f"logits, 2 x 1024 tokens, fp32: max |ours - HF| = {err:.2e} "
      f"(max |HF| {ref.abs().max().item():.2f}), "
      f"argmax agreement {(got.argmax(-1) == ref.argmax(-1)).float().mean().item():.4f}")

prompt = idx[:1, :32]
with torch.no_grad():
    hf_out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64,
                         do_sample=False, eos_token_id=None, pad_token_id=0)[0, 32:].tolist()
ntp, _ = batched.ntp_generate(ours, prompt, DecodeSettings(mask_id=None), 64)
settings = DecodeSettings(mask_id=128002, k=16, gamma=1e9, exact=True)
exact, stats = exact_generate(ours, prompt, settings, 64)
same = sum(a == b for a, b in zip(ntp[0], hf_out))
first_diff = next((i for i, (a, b) in enumerate(zip(ntp[0], hf_out)) if a != b), None)
print(f"greedy, 64 tokens: ours NTP == HF generate on {same}/64 tokens "
      f"(first difference at {first_diff}); "
      f"exact SBD k=16 == our NTP: {exact[0] == ntp[0]} "
      f"({stats.nfe} forwards for {stats.tokens} tokens)")

# tiny data for the pipeline: addition pairs as chat SFT rows and a benchmark with numeric answers
rows = [(a, b) for a in range(3, 60, 7) for b in range(5, 90, 11)]
with open(os.path.join(out_dir, "pairs.jsonl"), "w") as f:
    for a, b in rows:
        row = {"prompt": f"What is {a} + {b}?", "response": f"{a} + {b} = {a + b}. #### {a + b}"}
        f.write(json.dumps(row) + "\n")
with open(os.path.join(out_dir, "bench.jsonl"), "w") as f:
    for a, b in rows:
        f.write(json.dumps({"prompt": f"What is {a} + {b}?", "answer": a + b}) + "\n")
print(f"wrote {len(rows)} pairs and benchmark rows")
