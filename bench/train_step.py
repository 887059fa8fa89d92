"""
The SBD training step, timed: logits at every slot against logits at the labelled slots only
(train.py head_at_labels), side by side in one run, interleaved, warm-up excluded.

    python -m bench.train_step                                  # the demo: a 0.8M GPT, addition
    python -m bench.train_step --init_from=smollm2 --dataset=wordproblems --seq_len=192 \\
        --batch_size=4 --dtype=auto                             # SmolLM2-135M (pip install gguf)

Each repetition times `steps` optimizer steps of each variant on the same batches (forward,
backward, AdamW), so the ratio is measured within one repetition; the median and range over
repetitions are printed. --profile=True also prints the operators that take the most time.
Both variants compute the same loss (tests/test_head_at_labels.py): only the time differs.
"""

import statistics
import sys
import time

import torch

import sbd
from configurator import ConfigError, configure, pick_device, resolve_dtype
from model import GPT, IGNORE_INDEX, GPTConfig
from pretrained.loading import load_pretrained
from tasks import CharTask, JsonlTask

init_from = "scratch"  # 'scratch': the demo's GPT; or a pretrained model ('smollm2', a .gguf)
dataset = "addition"
seq_len = 192  # rows of a chat dataset
batch_size = 32
k = 12  # the block size of every timed step (the demo draws 8..16)
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
        config = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=task.seq_len,
                           vocab_size=task.vocab_size, dropout=0.0, bias=False)
        return GPT(config).to(device), task
    model, tokenizer = load_pretrained(init_from, device, torch.float32)
    return model.train(), JsonlTask(dataset, tokenizer, seq_len)


def batches(task, n, generator):
    """n SBD batches: (idx, pos, mask, labels, L) as train.py's forward_loss makes them."""
    x, y, answer = task.training_tensors("train", True)
    out = []
    for _ in range(n):
        ix = torch.randint(len(x), (batch_size,), generator=generator)
        xb, yb, ab = x[ix], y[ix], answer[ix]
        used = int(((yb != IGNORE_INDEX) | ab).any(0).nonzero().max()) + 1  # drop padding
        xb, yb, ab = xb[:, :used], yb[:, :used], ab[:, :used]
        phases = ab.int().argmax(dim=1) % k  # block_phase='answer'
        out.append((*sbd.sbd_inputs(xb, yb, task.mask_id, k, phases, ab, generator), used))
    return out


def train_steps(model, optimizer, data, at_labels, autocast):
    """Seconds for one optimizer step per batch of data."""
    t0 = time.perf_counter()
    for idx, pos, mask, labels, L in data:
        with autocast:
            at = labels != IGNORE_INDEX if at_labels else None
            logits, _ = model(idx, pos=pos, mask=mask, at=at)
            loss = sbd.sbd_loss(logits, labels, L)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


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
    model, task = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)  # small: the weights barely move
    data = batches(task, steps, torch.Generator().manual_seed(seed))
    tokens = sum(idx.numel() for idx, *_ in data) / steps
    labelled = sum(int((lab != IGNORE_INDEX).sum()) for *_, lab, _ in data) / steps
    print(f"{init_from}: {tokens:.0f} slots per step, {labelled:.0f} labelled "
          f"({100 * labelled / tokens:.0f}%), {ptdtype}, {torch.get_num_threads()} threads")
    for _ in range(warmup):
        train_steps(model, optimizer, data[:1], False, autocast)
        train_steps(model, optimizer, data[:1], True, autocast)
    times = {False: [], True: []}
    for _ in range(reps):
        for at_labels in (False, True):
            seconds = train_steps(model, optimizer, data, at_labels, autocast)
            times[at_labels].append(seconds / steps)
    ratio = [a / b for a, b in zip(times[False], times[True])]
    for at_labels, name in ((False, "logits at every slot"), (True, "logits at labelled slots")):
        t = times[at_labels]
        print(f"{name:26s} {statistics.median(t) * 1e3:8.1f} ms/step "
              f"[{min(t) * 1e3:.1f}, {max(t) * 1e3:.1f}]")
    print(f"speed-up of the labelled-slot head: {statistics.median(ratio):.2f}x "
          f"[{min(ratio):.2f}x, {max(ratio):.2f}x] over {reps} interleaved repetitions")
    if profile:
        with torch.profiler.profile() as p:
            train_steps(model, optimizer, data, True, autocast)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main(sys.argv[1:])
