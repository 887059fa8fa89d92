"""
The SBD stage's training step with a block adapter against the paper's full fine-tune, side by
side on the same batches, interleaved, warm-up excluded (train.py adapter_rank):

    python -m bench.adapter_step                                 # the demo's GPT
    python -m bench.adapter_step --init_from=smollm2 --dataset=wordproblems --seq_len=192 \\
        --batch_size=4 --dtype=auto --rank=64                    # SmolLM2-135M (pip install gguf)

Arms, each a whole optimizer step (forward, backward, fused AdamW), logits at labelled slots:
- full fine-tune: Eq. 14 over both halves, every weight trained (adapter_rank=0);
- adapter, one forward: the masked-token term from the forward over both halves, the adapter alone
  trained (the path train.py takes with attention='flex');
- adapter, clean half cached: sbd.adapter_loss, the clean half run once without autograd as a KV
  cache (train.py's path with attention='sdpa').
The two adapter arms compute the same loss (printed: the largest difference).
"""

import statistics
import sys
import time

import torch

import bench.train_step as step
import sbd
from bench.measure import cpu_name
from configurator import configure, pick_device, resolve_dtype
from model import IGNORE_INDEX, attach_adapter
from sbd import freeze_base

rank = 64  # the adapter's rank
layers = "all"  # which linear layers carry it: 'all', 'attention', 'mlp'
OPTIONS = ("init_from", "dataset", "seq_len", "batch_size", "k", "dtype", "steps", "reps",
           "warmup", "threads", "device", "seed")


def full_loss(model, inputs, labels, L, at, ptdtype):
    logits, _ = model(**inputs, at=at)
    return sbd.sbd_loss(logits, labels, L)[0]


def one_forward_loss(model, inputs, labels, L, at, ptdtype):
    logits, _ = model(**inputs, at=at, block_start=L)
    return sbd.sbd_loss(logits, labels, L, ntp_weight=0.0)[0]


def cached_loss(model, inputs, labels, L, at, ptdtype):
    idx = inputs["idx"]
    cache = model.new_cache(idx.size(0), idx.size(1), idx.device, ptdtype)
    return sbd.adapter_loss(model, cache, idx, inputs["pos"], inputs["mask"], labels, L, at)[0]


ARMS = {"full fine-tune": full_loss, "adapter, one forward": one_forward_loss,
        "adapter, clean half cached": cached_loss}


def main(argv):
    settings = {name: getattr(step, name) for name in OPTIONS}
    settings.update(rank=rank, layers=layers)
    configure(settings, argv)
    for name in OPTIONS:
        setattr(step, name, settings[name])
    step.stage = "sbd"
    if settings["threads"]:
        torch.set_num_threads(settings["threads"])
    dev = pick_device(settings["device"])
    ptdtype = resolve_dtype(settings["dtype"], dev)
    use_autocast = ptdtype != "float32"
    autocast = torch.autocast(dev.split(":")[0], getattr(torch, ptdtype), enabled=use_autocast)
    kv_dtype = getattr(torch, ptdtype) if use_autocast else None
    torch.manual_seed(settings["seed"])
    model, task = step.build()
    attach_adapter(model, settings["rank"], settings["layers"], task.mask_id)
    model.train()
    for p in model.parameters():  # the adapter starts trained a little: B = 0 hides nothing
        if p.requires_grad and p.dim() == 2 and not p.any():
            torch.nn.init.normal_(p, std=0.01)
    data = step.batches(task, settings["steps"], torch.Generator().manual_seed(settings["seed"]))
    optimizers = {}
    for name in ARMS:  # lr 0: every arm sees the same weights
        if name == "full fine-tune":
            model.requires_grad_(True)
        else:
            freeze_base(model)
        optimizers[name] = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                             lr=0.0, fused=True)
    n_adapter = sum(p.numel() for p in optimizers["adapter, one forward"].param_groups[0]["params"])
    print(f"{settings['init_from']}, SBD step, k={settings['k']}, batch {settings['batch_size']}: "
          f"adapter rank {settings['rank']} on {settings['layers']} layers "
          f"({n_adapter / 1e6:.2f}M parameters), {ptdtype}, {torch.get_num_threads()} threads, "
          f"{cpu_name() if dev == 'cpu' else dev}")
    run = lambda name: steps_of(name, model, optimizers[name], data, autocast, kv_dtype)
    for _ in range(settings["warmup"]):
        for name in ARMS:
            run(name)
    times, losses = {name: [] for name in ARMS}, {}
    for _ in range(settings["reps"]):
        for name in ARMS:
            seconds, losses[name] = run(name)
            times[name].append(seconds)
    print_times(times, losses, settings)


def steps_of(name, model, optimizer, data, autocast, kv_dtype):
    """One arm's optimizer steps over data -> (seconds per step, losses)."""
    if name == "full fine-tune":
        model.requires_grad_(True)
    else:
        freeze_base(model)
    t0, losses = time.perf_counter(), []
    for inputs, labels, L in data:
        at = labels != IGNORE_INDEX
        with autocast:
            loss = ARMS[name](model, inputs, labels, L, at, kv_dtype)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return (time.perf_counter() - t0) / len(data), losses


def print_times(times, losses, settings):
    first = next(iter(ARMS))
    for name, t in times.items():
        ratio = [a / b for a, b in zip(t, times[first])]
        print(f"{name:28s} {statistics.median(t) * 1e3:8.1f} ms/step [{min(t) * 1e3:.1f}, "
              f"{max(t) * 1e3:.1f}], {statistics.median(ratio):.2f}x [{min(ratio):.2f}x, "
              f"{max(ratio):.2f}x] the full fine-tune's time")
    a, b = losses["adapter, one forward"], losses["adapter, clean half cached"]
    print(f"(medians and ranges over {settings['reps']} interleaved repetitions of "
          f"{settings['steps']} steps; the adapter arms' losses differ by at most "
          f"{max(abs(x - y) for x, y in zip(a, b)):.1e})")


if __name__ == "__main__":
    main(sys.argv[1:])
