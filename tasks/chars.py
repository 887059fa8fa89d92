"""
A character-level task of data/<name>/ (the demo's addition): a folder holds prepare.py, which
writes train.txt / val.txt / test.txt (one "prompt<TAB>completion" per line) and meta.json
(characters, mask and stop characters, lengths). Each example becomes one fixed-length row:
prompt, completion, the stop character, then more stop characters as fill, so every row has the
same length and the completion starts at the same place in every row.
"""

import json
import os

import torch

from configurator import ConfigError
from model import IGNORE_INDEX
from tasks.files import data_version, prepared_folder


class CharTask:
    def __init__(self, name):
        folder = prepared_folder(name, "meta.json")
        meta_path = os.path.join(folder, "meta.json")
        with open(meta_path) as f:
            meta = json.load(f)
        self.name, self.meta = name, meta
        self.chars = meta["chars"]
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.mask_id, self.stop_id = self.stoi[meta["mask"]], self.stoi[meta["stop"]]
        self.stop_ids = [self.stop_id]
        self.tokenizer_info = dict(kind="char", chars=self.chars)  # a checkpoint keeps it to decode
        self.prompt_len, self.seq_len = meta["prompt_len"], meta["seq_len"]
        self.splits = {s: self._read(os.path.join(folder, f"{s}.txt"))
                       for s in ("train", "val", "test")}
        self.data_version = data_version([meta_path] + [os.path.join(folder, f"{s}.txt")
                                                        for s in self.splits])

    def _read(self, path):
        with open(path) as f:
            return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ConfigError(f"characters outside the vocabulary of {self.name}: {unknown}")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def encode_prompt(self, prompt):
        """What the model is given to answer a problem (evaluate.py): the prompt's characters."""
        return self.encode(prompt)

    def shape_prompt(self, text):
        """A user's prompt as training showed prompts -> (ids, what was done or None): a task
        whose prompts are right-aligned to prompt_len characters gets its spaces on the left."""
        width = self.prompt_len
        widths = {len(prompt) for prompt, _ in self.splits["test"][:100]}
        if widths != {width} or len(text) >= width or text != text.lstrip():
            return self.encode(text), None
        shaped = text.rjust(width)
        return (self.encode(shaped),
                f"right-aligned to {width} characters as in training: {shaped!r}")

    @property
    def max_new_tokens(self):
        """The longest completion a row holds, its stop character included."""
        return self.seq_len - self.prompt_len

    def rows(self, split):
        """A split's examples as one (N, seq_len + 1) tensor: prompt, completion, stop, fill."""
        rows = []
        for prompt, completion in self.splits[split]:
            ids = self.encode(prompt + completion + self.meta["stop"])
            rows.append(ids + [self.stop_id] * (self.seq_len + 1 - len(ids)))
        return torch.tensor(rows, dtype=torch.long)

    def training_tensors(self, split, loss_on_answer_only):
        """x, y (N, seq_len): inputs, next-token targets; answer (N, seq_len): x[i] isn't prompt."""
        rows = self.rows(split)
        x, y = rows[:, :-1], rows[:, 1:].clone()
        positions = torch.arange(self.seq_len)
        answer = (positions >= self.prompt_len).expand_as(x)  # (N, seq_len): tokens to be written
        if loss_on_answer_only:  # as instruction tuning: never learn to predict the (random) prompt
            y[:, positions < self.prompt_len - 1] = IGNORE_INDEX
        return x, y, answer

    def final_answer(self, completion):
        """What gets graded: the text after the last answer marker up to '.', else all of it."""
        text = completion.split(self.meta["stop"])[0]
        marker = self.meta.get("answer_marker")
        if marker and marker in text:
            return text.rsplit(marker, 1)[1].split(".")[0]
        return text

    def is_correct(self, completion, reference):
        return self.final_answer(completion) == self.final_answer(reference)
