"""
Tasks with verifiable answers (data/<name>/): load and tokenise them, make training batches, grade answers.

A task folder holds prepare.py, which writes train.txt / val.txt / test.txt (one "prompt<TAB>completion"
per line) and meta.json (characters, mask and stop characters, lengths). Each example becomes one
fixed-length row: prompt, completion, the stop character, then more stop characters as fill, so every row
has the same length and the completion starts at the same place in every row.
"""

import json
import os
import subprocess
import sys

import torch

from model import IGNORE_INDEX

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


class CharTask:
    def __init__(self, name):
        folder = os.path.join(DATA_DIR, name)
        prepare = os.path.join(folder, "prepare.py")
        if not os.path.exists(prepare):
            known = sorted(d for d in os.listdir(DATA_DIR) if os.path.exists(os.path.join(DATA_DIR, d, "prepare.py")))
            raise FileNotFoundError(f"unknown dataset {name!r}: no {prepare}. Known datasets: {known}")
        if not os.path.exists(os.path.join(folder, "meta.json")):  # first run: make the data, nothing downloads
            print(f"preparing dataset {name} ...")
            subprocess.run([sys.executable, prepare], check=True)
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        self.name, self.meta = name, meta
        self.chars = meta["chars"]
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.mask_id, self.stop_id = self.stoi[meta["mask"]], self.stoi[meta["stop"]]
        self.prompt_len, self.seq_len = meta["prompt_len"], meta["seq_len"]
        self.splits = {s: self._read(os.path.join(folder, f"{s}.txt")) for s in ("train", "val", "test")}

    def _read(self, path):
        with open(path) as f:
            return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def rows(self, split):
        """All examples of a split as one (N, seq_len + 1) tensor: prompt, completion, stop, stop fill."""
        rows = []
        for prompt, completion in self.splits[split]:
            ids = self.encode(prompt + completion + self.meta["stop"])
            rows.append(ids + [self.stop_id] * (self.seq_len + 1 - len(ids)))
        return torch.tensor(rows, dtype=torch.long)

    def training_tensors(self, split, loss_on_answer_only):
        """x, y (N, seq_len): inputs and next-token targets; answer (N, seq_len): x[i] is not prompt."""
        rows = self.rows(split)
        x, y = rows[:, :-1], rows[:, 1:].clone()
        positions = torch.arange(self.seq_len)
        answer = (positions >= self.prompt_len).expand_as(x)  # (N, seq_len): tokens the model must write
        if loss_on_answer_only:  # like instruction tuning: never learn to predict the (random) prompt
            y[:, positions < self.prompt_len - 1] = IGNORE_INDEX
        return x, y, answer

    def final_answer(self, completion):
        """What gets graded: the text after the last answer marker up to '.', else the whole completion."""
        text = completion.split(self.meta["stop"])[0]
        marker = self.meta.get("answer_marker")
        if marker and marker in text:
            return text.rsplit(marker, 1)[1].split(".")[0]
        return text

    def is_correct(self, completion, reference):
        return self.final_answer(completion) == self.final_answer(reference)
