"""
The product's fast decode on a GPU: the static cache's step compiled with CUDA graphs
(batched.compiled_step, mode reduce-overhead) against the same decoders eager. No download:
random models.

1. Tiny GPT and Llama in fp32: NTP, plain SBD, exact SBD at batch 1 and 2, and exact sampling with
   a fixed seed, compiled == eager token for token.
2. Llama-3.2-1B's shapes in bf16, random weights: NTP decode tokens/s after the prefill, eager and
   compiled (CUDA graphs), and how many of 64 greedy tokens agree (bf16: a near-tie may differ).

    python gpu/check_fast_decode.py          # about 2-3 minutes on one H100, most of it compiling
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from pretrained.shapes import build_model  # noqa: E402
from serving import (
    batched,  # noqa: E402
    exact,  # noqa: E402
)
from serving.layout import lay_out_for_decoding  # noqa: E402
from serving.settings import ServingSettings  # noqa: E402


def random_model(family, dtype, std=0.5, **overrides):
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = build_model(family, **overrides)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return lay_out_for_decoding(m.eval(), dtype)


def tiny_checks():
    failures = 0
    for family in ("gpt-tiny", "llama-tiny"):
        m = random_model(family, torch.float32)
        mask_id = m.config.vocab_size - 1
        plain = ServingSettings(mask_id=mask_id, k=4, gamma=0.5)
        greedy_exact = plain.replace(gamma=1e9, exact=True)
        sampled = plain.replace(exact=True, rule="left", temperature=1.0, top_k=20)
        for B in (1, 2):
            prompt = torch.randint(0, mask_id, (B, 5), device="cuda",
                                   generator=torch.Generator("cuda").manual_seed(B))
            for name, decode, settings in (("NTP", batched.ntp_generate, plain),
                                           ("plain SBD", batched.sbd_generate, plain),
                                           ("exact SBD", exact.exact_generate, greedy_exact),
                                           ("exact sampling", exact.exact_generate, sampled)):
                eager, _ = decode(m, prompt, settings, 16, torch.Generator("cuda").manual_seed(0))
                compiled, _ = decode(m, prompt, settings.replace(compiled=True), 16,
                                     torch.Generator("cuda").manual_seed(0))
                ok = compiled == eager
                failures += not ok
                print(f"{family} batch {B} {name}: compiled == eager {ok}", flush=True)
    return failures


def speed_check():
    m = random_model("llama3.2-1b", torch.bfloat16, std=0.02, max_seq_len=2048)
    prompt = torch.randint(0, 128000, (1, 32), device="cuda")
    settings = ServingSettings(mask_id=None, k=16)
    t0 = time.perf_counter()
    seconds = batched.warm_up(m, prompt, 64, settings.replace(compiled=True))
    print(f"llama3.2-1b shapes, bf16: compile {seconds:.0f} s ({time.perf_counter() - t0:.0f})")
    results = {}
    for name, s in (("eager", settings), ("compiled", settings.replace(compiled=True))):
        batched.ntp_generate(m, prompt, s, 64)  # warm
        out, stats = batched.ntp_generate(m, prompt, s, 64)
        results[name] = out[0]
        speed = stats.tokens[0] / (stats.wall_time - stats.prefill_time)
        print(f"    NTP {name}: {speed:.1f} tokens/s after the prefill", flush=True)
    same = sum(a == b for a, b in zip(results["eager"], results["compiled"]))
    print(f"    {same} of 64 greedy tokens agree (bf16)")


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name())
    n_failed = tiny_checks()
    speed_check()
    print("FAILED" if n_failed else "all compiled decodes equal the eager ones")
    sys.exit(1 if n_failed else 0)
