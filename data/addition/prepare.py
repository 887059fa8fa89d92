"""
Column addition written out as a reasoning trace: a task with verifiable answers whose outputs are
long, mostly predictable scaffolding with a few hard tokens, like the reasoning traces where SBD
pays off (docs/findings.md, The task).

    prompt (right-aligned, 13 chars): " Q:52+228=?A:"
    completion:                       "ones 2+8+0=10 c1;tens 5+2+1=08 c0;huns 0+2+0=02 c0;so 0280."
    then the stop character "\\n"

Each step copies two operand digits and the carry (easy), then writes a two-digit column sum and
the new carry (the only hard tokens). The answer has four digits, zero-padded like the column sums,
so that each of its digits sits at one place and copies one place of the trace.
main(direct=True) writes the answer alone instead ("0280."): each of its digits then depends on
carries from digits not yet written (data/addition_direct/ is that variant).

Operands have 1-3 digits. The split is a hash of the problem, so a test problem never appears in
train or val. Every split has train's mix of operand lengths: train is drawn first (short operands
are few, so train runs out of them), then val and test are drawn class by class (the digit counts
of the two operands) in train's proportions. Writes train.txt / val.txt / test.txt (one
"prompt<TAB>completion" per line) and meta.json (vocabulary, mask and stop characters, lengths).

Run: python data/addition/prepare.py   (train.py runs it when its files are missing or older)
"""

import hashlib
import json
import os
import random
import sys

PLACES = ["ones", "tens", "huns"]
PROMPT_WIDTH = 13
MASK, STOP = "_", "\n"  # the SBD mask character is never part of a problem
HERE = os.path.dirname(os.path.abspath(__file__))


def trace(a, b):
    """The written-out column addition of a + b (the completion, without the stop character)."""
    da, db = f"{a:03d}"[::-1], f"{b:03d}"[::-1]  # digits, ones first
    carry, steps = 0, []
    for place, x, y in zip(PLACES, da, db):
        total = int(x) + int(y) + carry
        steps.append(f"{place} {x}+{y}+{carry}={total:02d} c{total // 10}")
        carry = total // 10
    return ";".join(steps) + f";so {a + b:04d}."


def answer(a, b):
    """The answer alone, four digits as the trace ends with: '0280.'."""
    return f"{a + b:04d}."


def prompt(a, b):
    return f"Q:{a}+{b}=?A:".rjust(PROMPT_WIDTH)


def split_of(a, b):
    """Deterministic split from a hash of the problem: ~5% test, ~3% val, the rest train."""
    h = int(hashlib.sha256(f"{a}+{b}".encode()).hexdigest(), 16) % 100
    return "test" if h < 5 else "val" if h < 8 else "train"


def digits(n):
    return len(str(n))


def sample_train(n, rng):
    """n distinct train problems, operand digit counts drawn uniformly in 1..3 (short ones run out:
    there are only 100 pairs of one-digit operands)."""
    seen, out = set(), []
    while len(out) < n:
        a, b = (rng.randint(0, 10 ** rng.randint(1, 3) - 1) for _ in range(2))
        if (a, b) not in seen and split_of(a, b) == "train":
            seen.add((a, b))
            out.append((a, b))
    return out


def sample_like(split, n, reference, rng):
    """n distinct problems of `split` with the reference problems' mix of digit-count classes:
    class (da, db) gets round(n * its share of the reference), largest remainders first."""
    counts = {}
    for a, b in reference:
        counts[digits(a), digits(b)] = counts.get((digits(a), digits(b)), 0) + 1
    exact = {c: n * k / len(reference) for c, k in counts.items()}
    quota = {c: int(x) for c, x in exact.items()}
    largest_remainders = sorted(exact, key=lambda c: exact[c] - quota[c], reverse=True)
    for c in largest_remainders[:n - sum(quota.values())]:
        quota[c] += 1
    out = []
    for (da, db), k in sorted(quota.items()):
        pool = [(a, b) for a in range(10 ** (da - 1) if da > 1 else 0, 10 ** da)
                for b in range(10 ** (db - 1) if db > 1 else 0, 10 ** db)
                if split_of(a, b) == split]
        if len(pool) < k:
            raise ValueError(f"{split}: class {da}+{db} digits has {len(pool)} problems, need {k}")
        out += rng.sample(pool, k)
    rng.shuffle(out)
    return out


def main(out_dir=HERE, n_train=100_000, n_val=2000, n_test=1000, seed=1337, direct=False):
    rng = random.Random(seed)
    completion = answer if direct else trace
    problems = {"train": sample_train(n_train, rng)}
    problems["val"] = sample_like("val", n_val, problems["train"], rng)
    problems["test"] = sample_like("test", n_test, problems["train"], rng)
    for split, pairs in problems.items():
        with open(os.path.join(out_dir, f"{split}.txt"), "w") as f:
            for a, b in pairs:
                f.write(f"{prompt(a, b)}\t{completion(a, b)}\n")
    chars = sorted(set("".join(prompt(a, b) + trace(a, b) for a in (0, 123456789) for b in (0, 99)))
                   | {STOP})
    sizes = {split: len(pairs) for split, pairs in problems.items()}
    meta = dict(chars="".join(chars) + MASK, mask=MASK, stop=STOP,
                answer_marker=None if direct else "so ",
                prompt_len=PROMPT_WIDTH, seq_len=PROMPT_WIDTH + len(completion(999, 999)) + 1,
                sizes=sizes)
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {sizes} problems and meta.json to {out_dir}")
    return problems


if __name__ == "__main__":
    main(*sys.argv[1:2])
