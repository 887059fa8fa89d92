"""
A training step, timed in the variants train.py could take, side by side in one run, interleaved,
warm-up excluded: AdamW's for-each implementation or its fused kernel, then logits at every slot
or only at the labelled slots (train.py head_at_labels), then the model under torch.compile
(train.py compile; its compile time is printed apart), for either stage (NTP or SBD).

    python -m bench.train_step                                  # the demo: a 0.2M GPT, addition
    python -m bench.train_step --init_from=smollm2 --dataset=wordproblems --seq_len=192 \\
        --batch_size=4 --dtype=auto --stage=ntp                 # SmolLM2-135M (pip install gguf)

Each repetition times `steps` optimizer steps of each variant on the same batches (forward,
backward, AdamW), so the ratios are measured within one repetition; the median and range over
repetitions are printed. --profile=True also prints the operators that take the most time.
Every variant computes the same loss (tests/test_head_at_labels.py; compiled: up to rounding, as
fused kernels add in another order, the largest difference printed): only the time differs.
"""

import statistics
import sys
import time

import torch

import sbd
from bench.measure import cpu_name
from configurator import ConfigError, configure, pick_device, resolve_dtype
from model import GPT, IGNORE_INDEX, GPTConfig
from pretrained.loading import load_pretrained
from tasks import CharTask, JsonlTask

init_from = "scratch"  # 'scratch': the demo's GPT; or a pretrained model ('smollm2', a .gguf)
dataset = "addition"
n_embd = 64  # the demo's width (train.py)
seq_len = 192  # rows of a chat dataset
batch_size = 32
stage = "sbd"  # 'sbd' (two halves, Eq. 14) or 'ntp'
k = 12  # the block size of every timed SBD step (the demo draws 8..16)
dtype = "float32"  # or 'auto': bf16 autocast where the CPU computes it natively
steps = 3  # optimizer steps per variant and repetition
reps = 5
warmup = 2
threads = 0  # torch threads; 0 = default
profile = False
device = "cpu"
seed = 1337


def build():
    """(model, task) as train.py builds them for its SBD stage."""
    if init_from == "scratch":
        task = CharTask(dataset)
        config = GPTConfig(n_layer=4, n_head=4, n_embd=n_embd, block_size=task.seq_len,
                           vocab_size=task.vocab_size, dropout=0.0, bias=False)
        return GPT(config).to(device), task
    model, tokenizer = load_pretrained(init_from, device, torch.float32)
    return model.train(), JsonlTask(dataset, tokenizer, seq_len)


def batches(task, n, generator):
    """n batches of train.py's forward_loss for the stage: (model inputs, labels, L)."""
    x, y, answer = task.training_tensors("train", True)
    out = []
    for _ in range(n):
        ix = torch.randint(len(x), (batch_size,), generator=generator)
        xb, yb, ab = x[ix], y[ix], answer[ix]
        used = int(((yb != IGNORE_INDEX) | ab).any(0).nonzero().max()) + 1  # drop padding
        xb, yb, ab = xb[:, :used], yb[:, :used], ab[:, :used]
        if stage == "ntp":
            out.append((dict(idx=xb), yb, used))
            continue
        phases = sbd.block_phases(ab, k, "answer")
        idx, pos, mask, labels = sbd.sbd_inputs(xb, yb, task.mask_id, k, phases, ab, generator)
        out.append((dict(idx=idx, pos=pos, mask=mask), labels, used))
    return out


def loss_of(model, inputs, labels, L, at_labels):
    """train.py's forward_loss: the NTP loss, or Eq. 14's over both halves."""
    at = labels != IGNORE_INDEX if at_labels else None
    if stage == "ntp":
        return model(**inputs, targets=labels if at is None else labels[at], at=at)[1]
    logits, _ = model(**inputs, at=at)
    return sbd.sbd_loss(logits, labels, L)[0]


def train_steps(model, optimizer, data, at_labels, autocast):
    """(seconds for one optimizer step per batch of data, the losses)."""
    t0, losses = time.perf_counter(), []
    for inputs, labels, L in data:
        with autocast:
            loss = loss_of(model, inputs, labels, L, at_labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return time.perf_counter() - t0, losses


# name -> (fused AdamW, logits at labelled slots only, torch.compile); the third is what
# train.py does when head_at_labels is on, the first what it did before either change
VARIANTS = {"for-each AdamW, every slot": (False, False, False),
            "fused AdamW, every slot": (True, False, False),
            "fused AdamW, labelled slots": (True, True, False),
            "compiled, fused, every slot": (True, False, True),
            "compiled, fused, labelled": (True, True, True)}


def main(argv):
    configure(globals(), argv)
    if steps < 1 or reps < 1 or k < 1:
        raise ConfigError(f"steps, reps and k must be >= 1, got {steps}, {reps}, {k}")
    if threads:
        torch.set_num_threads(threads)
    dev = pick_device(device)
    ptdtype = resolve_dtype(dtype, dev)
    autocast = torch.autocast("cpu" if dev == "cpu" else dev.split(":")[0],
                              getattr(torch, ptdtype), enabled=ptdtype != "float32")
    torch.manual_seed(seed)
    if stage not in ("sbd", "ntp"):
        raise ConfigError(f"stage must be 'sbd' or 'ntp', got {stage!r}")
    model, task = build()
    # one optimizer per variant (its own state); lr 0: every variant sees the same weights, so
    # their losses compare (AdamW's work per step does not depend on lr)
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=0.0, fused=fused)
                  for name, (fused, *_) in VARIANTS.items()}
    compiled = torch.compile(model)  # the same parameters, traced on first use
    data = batches(task, steps, torch.Generator().manual_seed(seed))
    tokens = sum(inputs["idx"].numel() for inputs, *_ in data) / steps
    labelled = sum(int((lab != IGNORE_INDEX).sum()) for _, lab, _ in data) / steps
    print(f"{init_from}, {stage} step: {tokens:.0f} slots per step, {labelled:.0f} labelled "
          f"({100 * labelled / tokens:.0f}%), {ptdtype}, {torch.get_num_threads()} threads, "
          f"{cpu_name() if dev == 'cpu' else dev}")
    net = {name: compiled if compile_ else model for name, (_, _, compile_) in VARIANTS.items()}
    warm, losses = {}, {}  # warm-up seconds (the compile), each variant's losses
    for _ in range(warmup):  # every batch shape once: a new one would compile again
        for name, (_, at_labels, _) in VARIANTS.items():
            seconds = train_steps(net[name], optimizers[name], data, at_labels, autocast)[0]
            warm.setdefault(name, seconds)
    times = {name: [] for name in VARIANTS}
    for _ in range(reps):
        for name, (_, at_labels, _) in VARIANTS.items():
            seconds, losses[name] = train_steps(net[name], optimizers[name], data, at_labels,
                                                autocast)
            times[name].append(seconds / steps)
    first = next(iter(VARIANTS))
    for name, t in times.items():
        ratio = [a / b for a, b in zip(times[first], t)]
        print(f"{name:28s} {statistics.median(t) * 1e3:8.1f} ms/step [{min(t) * 1e3:.1f}, "
              f"{max(t) * 1e3:.1f}], {statistics.median(ratio):.2f}x [{min(ratio):.2f}x, "
              f"{max(ratio):.2f}x] the first's speed")
    print(f"(medians and ranges over {reps} interleaved repetitions of {steps} steps)")
    compiled_warm = [f"{warm[name]:.1f} s" for name, (*_, c) in VARIANTS.items() if c]
    print(f"compile: the first warm-up pass took {' and '.join(compiled_warm)} (eager: "
          f"{warm[first]:.1f} s); losses of the last repetition, largest difference from the "
          "first variant's: " + ", ".join(
              f"{max(abs(a - b) for a, b in zip(losses[first], v)):.1e}"
              for v in list(losses.values())[1:]))
    if profile:
        name = "fused AdamW, labelled slots"  # train.py's step with head_at_labels
        with torch.profiler.profile() as p:
            train_steps(model, optimizers[name], data, VARIANTS[name][1], autocast)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main(sys.argv[1:])
