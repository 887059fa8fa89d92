"""
Column addition written out as a reasoning trace: a task with verifiable answers whose outputs are long,
mostly predictable scaffolding with a few hard tokens, like the reasoning traces where SBD pays off.

    prompt (right-aligned to 13 chars):  " Q:52+228=?A:"
    completion:                          "ones 2+8+0=10 c1;tens 5+2+1=08 c0;huns 0+2+0=02 c0;so 0280."
    then the stop character "\n"

Each step copies two operand digits and the carry (easy), then writes a two-digit column sum and the new carry
(the only hard tokens). The answer has four digits, zero-padded like the column sums, so that each of its
digits sits at one place and copies one place of the trace. With the sum's own length ("so 63.") the
masked-token head had to work out the answer's length before it could copy a digit, and on some runs it
learned a shortcut that wrote the last digit of two-digit answers wrong at any γ (README Notes: the answer's
width). Operands have 1-3 digits. The split is a hash of the problem, so a test problem never appears in train
or val, whatever the sizes. Writes train.txt / val.txt / test.txt (one "prompt<TAB>completion" per line) and
meta.json (vocabulary, mask and stop characters, lengths).

Run: python data/addition/prepare.py   (train.py runs it when its files are missing or older than this file)
"""

import hashlib
import json
import os
import random
import sys

PLACES = ["ones", "tens", "huns"]
PROMPT_WIDTH = 13
MASK, STOP = "_", "\n"  # the SBD mask character is never part of a problem


def trace(a, b):
    """The written-out column addition of a + b (the completion, without the stop character)."""
    da, db = f"{a:03d}"[::-1], f"{b:03d}"[::-1]  # digits, ones first
    carry, steps = 0, []
    for place, x, y in zip(PLACES, da, db):
        total = int(x) + int(y) + carry
        steps.append(f"{place} {x}+{y}+{carry}={total:02d} c{total // 10}")
        carry = total // 10
    return ";".join(steps) + f";so {a + b:04d}."


def prompt(a, b):
    return f"Q:{a}+{b}=?A:".rjust(PROMPT_WIDTH)


def split_of(a, b):
    """Deterministic split from a hash of the problem: ~5% test, ~2% val, the rest train."""
    h = int(hashlib.sha256(f"{a}+{b}".encode()).hexdigest(), 16) % 100
    return "test" if h < 5 else "val" if h < 7 else "train"


def sample_problems(split, n, rng, seen=None):
    """n distinct problems of the split (and not in seen), operand digit counts uniform in 1..3."""
    seen, out = set(seen or ()), []
    while len(out) < n:
        a, b = (rng.randint(0, 10 ** rng.randint(1, 3) - 1) for _ in range(2))
        if (a, b) not in seen and split_of(a, b) == split:
            seen.add((a, b))
            out.append((a, b))
    return out


def main(out_dir=os.path.dirname(os.path.abspath(__file__)), n_train=100_000, n_val=2000, n_test=1000, seed=1337):
    rng = random.Random(seed)
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    problems = {split: sample_problems(split, n, rng) for split, n in (("train", n_train),
                                                                      ("val", min(n_val, 500)), ("test", n_test))}
    # γ is calibrated on val against budgets of half a point, which is 2.5 problems out of 500: val grew to
    # 2000. The extra ones are drawn last, so that train and test stay those of earlier runs.
    problems["val"] += sample_problems("val", max(0, n_val - 500), rng, seen=problems["val"])
    for split, pairs in problems.items():
        with open(os.path.join(out_dir, f"{split}.txt"), "w") as f:
            for a, b in pairs:
                f.write(f"{prompt(a, b)}\t{trace(a, b)}\n")
    chars = sorted(set("".join(prompt(a, b) + trace(a, b) for a in (0, 123456789) for b in (0, 99))) | {STOP})
    meta = dict(chars="".join(chars) + MASK, mask=MASK, stop=STOP, answer_marker="so ",
                prompt_len=PROMPT_WIDTH, seq_len=PROMPT_WIDTH + len(trace(999, 999)) + 1, sizes=sizes)
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {sizes} problems and meta.json to {out_dir}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
