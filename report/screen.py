"""
A lever screen in minutes: how well an SBD checkpoint's masked-token head drafts, read on val
answers with every answer token masked, one forward per block (docs/findings.md, "Screening").

    python -m report.screen --a=out-screen-paper                       # one checkpoint
    python -m report.screen --a=out-screen-paper --b=out-screen-shift  # two, paired

Each val row is the SBD training forward (sbd.sbd_layout) with every token from the answer's start
on masked, blocks of k starting at the answer as decoding's do. A noisy block there sees the clean
tokens before it and its own k masks: exactly what decoding's first forward of that block sees
when every earlier token is right (tests/test_screen.py checks it against that forward). Block
position 0 is read from the causal logits before the block (as decoders read it), position j >= 1
from the block slot sbd.read_at gives for the checkpoint's alignment.
Per checkpoint it prints:
- accuracy by block position (the argmax equals the answer token);
- the mean leading run of correct drafts per block (positions 1 on; position 0 is the causal
  head's in every arm): about what exact SBD keeps of a block drafted in one forward, past its
  first token, where the model's NTP decoding writes the answer;
- the masked-token loss at block positions 1 on (the answer token's negative log-likelihood
  where decoding reads it): a loss that compares across alignments, unlike train.py's estimate,
  whose labels differ between them;
- teacher-forced NTP accuracy (the causal head on the same answers).
With two checkpoints (trained on the same data, read with the same k), the paired difference of
leading runs over the same blocks, with its standard error, and the blocks better and worse.
With --benchmark (a chat model's val problems, e.g. data/wordproblems/val.jsonl) and
--decode_problems=n it also decodes n of them for real: NTP accuracy and exact SBD's tokens per
forward at this k, each block drafted in one forward (with each of --draft_floors), the number
the read-out stands in for.
"""

import json
import math
import os
import sys
from contextlib import nullcontext

import torch
from torch.nn import functional as F

import sbd
from checkpoint import load_checkpoint, settings_for
from configurator import configure, pick_device, require, resolve_dtype
from pretrained.loading import tokenizer_of
from sampling import ONE_FORWARD, greedy, suppress_mask
from tasks import BenchmarkTask, task_of_checkpoint
from tasks.solve import solve, tokens_per_forward

OPTIONS = dict(
    a="",  # train.py's out_dir (its ckpt_sbd.pt) or a checkpoint file
    b="",  # optional: a second one, read on the same blocks and paired against a
    problems=256,  # val rows read
    k=8,  # block size of the read-out
    batch_size=8,
    benchmark="",  # a chat model's val problems to decode ("" = the read-out only)
    decode_problems=0,  # how many of them
    draft_floors=(0.0,),  # exact SBD's min_draft_prob values they are decoded with
    answer_marker="####",
    dtype="auto",  # bf16 autocast where the CPU computes it natively
    device="",
)


def checkpoint_path(where):
    return os.path.join(where, "ckpt_sbd.pt") if os.path.isdir(where) else where


def read_slots(answer, k, token_shift, L, s):
    """(B, L) long: for each answer position p, the slot of the read-out forward whose logits
    predict it (-1 elsewhere), and phases (B,). Block position 0 is the clean slot p - 1 (causal
    logits); position j >= 1 the noisy slot of the block's position read_at(j)."""
    B = answer.size(0)
    phases = sbd.block_phases(answer, k, "answer")  # (B,) blocks start at the answer
    p = torch.arange(L)[None].expand(B, L)  # (B, L)
    j = (p - phases[:, None]) % k  # block position
    noisy_slot = L + (p - j + sbd.read_at(j, token_shift)) - s  # slot of position start + read_at
    slots = torch.where(j == 0, p - 1, noisy_slot)
    return torch.where(answer & (p > 0), slots, -1), phases


@torch.no_grad()
def read_out(model, checkpoint, x, answer, k, autocast, batch_size):
    """-> correct (N, L) bool at answer positions (masked head as decoding reads it), ntp_correct
    (N, L) bool (causal head), nll (N, L) of the answer token where read, is_read (N, L) bool,
    is_draft (N, L) bool (read from a block slot: block positions 1 on), phases (N,)."""
    token_shift = bool(checkpoint["config"].get("token_shift", False))
    mask_id, L = checkpoint["mask_id"], x.size(1)
    out = {name: [] for name in ("correct", "ntp_correct", "nll", "is_read", "is_draft",
                                 "phases")}
    device = next(model.parameters()).device
    for i in range(0, len(x), batch_size):
        xb, ab = x[i:i + batch_size].to(device), answer[i:i + batch_size].to(device)
        phases = sbd.block_phases(ab, k, "answer")
        masked = ab.cumsum(dim=1) > 0  # (B, L): the answer and all after it, as decoding's blocks
        s = sbd.first_noisy_position(masked, k, phases)
        idx, pos, mask, _ = sbd.sbd_layout(xb, xb, mask_id, [masked], k, phases, s, token_shift)
        slots, _ = read_slots(ab.cpu(), k, token_shift, L, s)
        slots = slots.to(device)
        is_read = slots >= 0  # (B, L)
        causal = torch.where(is_read, torch.arange(L, device=device) - 1, -1)  # NTP's slot p - 1
        at = torch.zeros(idx.shape, dtype=torch.bool, device=device)  # (B, T): slots to read
        rows = torch.arange(len(xb), device=device)[:, None].expand_as(slots)
        at[rows[is_read], slots[is_read]] = True
        at[rows[is_read], causal[is_read]] = True
        with autocast:
            logits, _ = model(idx, pos=pos, mask=mask, at=at, block_start=L)  # (N, V) read
        row_of = (at.flatten().cumsum(0) - 1).view(at.shape)  # slot -> its row of logits
        logits = suppress_mask(logits.float(), mask_id)
        tokens, logp = greedy(logits), F.log_softmax(logits, dim=-1)  # (N,), (N, V)
        row = lambda slot: row_of.gather(1, slot.clamp(min=0))  # (B, L): its row of logits
        out["correct"].append((tokens[row(slots)] == xb) & is_read)
        out["ntp_correct"].append((tokens[row(causal)] == xb) & is_read)
        out["nll"].append(torch.where(is_read, -logp[row(slots), xb], 0.0))
        out["is_read"].append(is_read)
        out["is_draft"].append(is_read & (slots >= L))  # a noisy slot: not the causal head's
        out["phases"].append(phases)
    return {name: torch.cat(v).cpu() for name, v in out.items()}


def block_stats(r, k):
    """Per block of every row: its leading run of correct drafts (positions 1 on), and accuracy by
    position (position 0 included)."""
    runs, hits, counts = [], torch.zeros(k), torch.zeros(k)
    for correct, is_read in zip(r["correct"], r["is_read"]):
        read = is_read.nonzero()[:, 0].tolist()
        if not read:
            continue
        first, is_read = read[0], set(read)  # the answer's first position: a block start
        for start in range(first, read[-1] + 1, k):
            block = [p for p in range(start, start + k) if p in is_read]
            flags = [bool(correct[p]) for p in block]
            drafts = flags[1:]
            runs.append(next((n for n, ok in enumerate(drafts) if not ok), len(drafts)))
            for j, ok in enumerate(flags):
                hits[j] += ok
                counts[j] += 1
    return runs, (hits / counts.clamp(min=1)).tolist()


def summarize(name, r, k):
    runs, by_position = block_stats(r, k)
    ntp = r["ntp_correct"].sum().item() / max(r["is_read"].sum().item(), 1)
    masked = sum(by_position[1:]) / max(k - 1, 1)
    loss = r["nll"][r["is_draft"]].mean().item()  # comparable across alignments: same positions
    print(f"{name}: {len(runs)} blocks of k={k}, leading run of correct drafts {mean(runs):.3f}, "
          f"masked accuracy at positions 1-{k - 1} {masked:.3f} (loss {loss:.3f}), "
          f"teacher-forced NTP {ntp:.3f}")
    print("  accuracy by block position: " + " ".join(f"{a:.2f}" for a in by_position))
    return dict(blocks=len(runs), leading_run=mean(runs), by_position=by_position,
                masked_accuracy=masked, masked_loss=loss, ntp_accuracy=ntp), runs


def decode_val(model, checkpoint, tokenizer, o, dtype):
    """NTP accuracy and exact SBD's tokens per forward on the benchmark's first val problems."""
    model = model.to(getattr(torch, dtype))
    task = BenchmarkTask(o["benchmark"], tokenizer, val_problems=o["decode_problems"],
                         max_new_tokens=128, answer_marker=o["answer_marker"])
    problems = task.splits["val"]
    base = settings_for(checkpoint, gamma=0.0).replace(k=o["k"])
    ntp = solve(model, task, problems, base, ntp=True, batch_size=32)
    out = dict(ntp_val_accuracy=ntp["accuracy"], exact={})
    for floor in o["draft_floors"]:
        settings = base.replace(gamma=ONE_FORWARD, exact=True, min_draft_prob=floor)
        exact = solve(model, task, problems, settings, batch_size=32)
        same = sum(a == b for a, b in zip(exact["completions"], ntp["completions"]))
        out["exact"][str(floor)] = dict(tokens_per_forward=tokens_per_forward(exact),
                                        same_as_ntp=same)
        print(f"  decoded {len(problems)} val problems: NTP {out['ntp_val_accuracy']:.1f}%, "
              f"exact k={o['k']} min_draft_prob={floor:g} {tokens_per_forward(exact):.2f} "
              f"tokens per forward ({same} completions as NTP's)")
    return out


def mean(values):
    return sum(values) / max(len(values), 1)


def paired(runs_a, runs_b):
    """Mean of b - a over the same blocks, its standard error, and blocks better and worse."""
    diffs = [b - a for a, b in zip(runs_a, runs_b)]
    m = mean(diffs)
    var = sum((d - m) ** 2 for d in diffs) / max(len(diffs) - 1, 1)
    return dict(diff=m, se=math.sqrt(var / max(len(diffs), 1)),
                better=sum(d > 0 for d in diffs), worse=sum(d < 0 for d in diffs))


def main(argv):
    o = configure(dict(OPTIONS), argv, "report.screen")
    require(o["a"], "--a: train.py's out_dir or a checkpoint to read out")
    device = pick_device(o["device"])
    dtype = resolve_dtype(o["dtype"], device)
    autocast = (torch.autocast(device.split(":")[0], torch.bfloat16) if dtype == "bfloat16"
                else nullcontext())
    results, runs, data = {}, {}, None
    for name in ("a", "b"):
        if not o[name]:
            continue
        path = checkpoint_path(o[name])
        model, checkpoint = load_checkpoint(path, device)
        llama = checkpoint["model_family"] == "llama"
        tokenizer = tokenizer_of(checkpoint["tokenizer"]) if llama else None
        task = task_of_checkpoint(checkpoint, path, tokenizer)
        x, _, answer = task.training_tensors("val", True)
        if data is not None and not torch.equal(x[:o["problems"]], data):
            raise SystemExit("--a and --b were trained on different data: nothing to pair")
        data = x[:o["problems"]]
        r = read_out(model, checkpoint, data, answer[:o["problems"]], o["k"], autocast,
                     o["batch_size"])
        results[name], runs[name] = summarize(f"{name} = {path}", r, o["k"])
        results[name]["checkpoint"] = path
        if o["benchmark"] and o["decode_problems"] and llama:
            results[name].update(decode_val(model, checkpoint, tokenizer, o, dtype))
        del model
    if "b" in runs:
        d = paired(runs["a"], runs["b"])
        results["paired"] = d
        print(f"b - a, leading run of correct drafts: {d['diff']:+.3f} ± {d['se']:.3f} (SE) over "
              f"{len(runs['a'])} blocks; b better on {d['better']}, worse on {d['worse']}")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
