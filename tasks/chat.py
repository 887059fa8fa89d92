"""
Instruction data for fine-tuning a chat model: prompt/response pairs in a local JSONL file, and
the one JSONL reader and chat-prompt builder that benchmarks and sample.py share.
"""

import json
import os

import torch

from configurator import ConfigError
from model import IGNORE_INDEX
from pretrained.tokenizer import Llama3Tokenizer
from tasks.files import data_version, prepared_folder


def read_jsonl(path, keys, what):
    """A JSONL file -> [(line number, dict)] for its non-empty lines, each dict with a string at
    every key of `keys` (other keys are kept). A malformed line is an error naming the file and
    the line."""
    shape = "{" + ", ".join(f'"{k}": "..."' for k in keys) + "}"
    if not os.path.exists(path):
        raise ConfigError(f"no {what} at {path}: expected a JSONL file with one {shape} object "
                          "per line")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{line_no}: not JSON ({e.msg}, column {e.colno}): "
                                  f"{line[:80]!r}") from None
            if isinstance(row, dict) and isinstance(row.get("answer"), (int, float)) \
                    and not isinstance(row["answer"], bool):
                row["answer"] = str(row["answer"])  # a numeric answer may be a JSON number
            if not (isinstance(row, dict) and all(isinstance(row.get(k), str) for k in keys)):
                raise ConfigError(f"{path}:{line_no}: expected {shape} (strings; a number for "
                                  f"an answer), got {line[:80]!r}")
            rows.append((line_no, row))
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


def chat_prompt(tokenizer, text):
    """A user message -> the ids a chat model answers from: the tokenizer's chat template, ending
    with the open assistant turn. Training rows, benchmarks and sample.py all prompt this way."""
    return tokenizer.encode_chat([{"role": "user", "content": text}])


def as_tokenizer(tokenizer):
    """A tokenizer object, or the path of a Llama 3 tokenizer.model."""
    if not isinstance(tokenizer, str):
        return tokenizer
    if not os.path.exists(tokenizer):
        raise ConfigError(f"no Llama tokenizer.model at {tokenizer} (it sits next to the weights)")
    return Llama3Tokenizer(tokenizer)


class JsonlTask:
    """Instruction data for a chat model: {"prompt": ..., "response": ...} pairs in JSONL.

    dataset: a .jsonl file (its val split is a fixed 1%, at least one pair, drawn with seed 0), or
    the name of a data/<name>/ folder whose prepare.py writes train.jsonl and val.jsonl (made on
    first use, as CharTask's). Each pair becomes one row of seq_len + 1 tokens: the chat prompt
    (chat_prompt), the response, the turn's end token, then padding. Longer rows are cut at the
    end; a pair whose prompt alone fills the seq_len inputs is dropped. Unlike CharTask the
    response starts at a different place in every row: `answer` marks it, and train.py starts each
    row's noisy blocks at its first response token, as decoding starts its first block.
    """

    def __init__(self, dataset, tokenizer, seq_len, val_fraction=0.01):
        self.tokenizer, self.seq_len = as_tokenizer(tokenizer), seq_len
        self.mask_id, self.stop_id = self.tokenizer.mask_id, self.tokenizer.eot_id
        self.stop_ids = self.tokenizer.stop_ids
        self.pad_id = self.tokenizer.pad_id  # fill after the turn's end, never a label
        if dataset.endswith(".jsonl"):
            self.name, paths = dataset, [dataset]
            pairs = self.read(dataset)
            order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)).tolist()
            n_val = max(1, round(val_fraction * len(pairs)))
            self.splits = {"train": [pairs[i] for i in order[n_val:]],
                           "val": [pairs[i] for i in order[:n_val]]}
        else:
            folder = prepared_folder(dataset, "train.jsonl")
            self.name, paths = dataset, [os.path.join(folder, f"{s}.jsonl")
                                         for s in ("train", "val")]
            self.splits = {s: self.read(path) for s, path in zip(("train", "val"), paths)}
        if len(self.splits["train"]) < 1:
            raise ConfigError(f"{dataset}: no training pairs (a .jsonl needs at least two)")
        self.data_version = data_version(paths)

    @property
    def max_new_tokens(self):
        """Decoding budget for a prompt of these pairs: a whole training row."""
        return self.seq_len

    @staticmethod
    def read(path):
        rows = read_jsonl(path, ("prompt", "response"), "instruction data")
        return [(row["prompt"], row["response"]) for _, row in rows]

    @property
    def tokenizer_info(self):
        return self.tokenizer.info

    @property
    def vocab_size(self):
        return self.tokenizer.vocab_size

    def encode(self, text):
        return self.tokenizer.encode(text)

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def encode_prompt(self, prompt):
        return chat_prompt(self.tokenizer, prompt)

    def has_row(self, prompt_ids):
        """Whether a pair gets a row: its prompt leaves room for a response token."""
        return len(prompt_ids) < self.seq_len

    def rows(self, split):
        """(N, seq_len + 1) ids: chat prompt, response, the turn's end, padding; and two (N,
        seq_len + 1) bool masks: the response and its end (what the model must write), and the
        padding."""
        rows, is_response, is_fill, n_cut = [], [], [], 0
        for prompt, response in self.splits[split]:
            p = self.encode_prompt(prompt)
            ids = p + self.encode(response.strip()) + [self.stop_id]
            n_cut += len(ids) > self.seq_len + 1
            if not self.has_row(p):  # no room for a single response token among the inputs
                continue
            ids = ids[:self.seq_len + 1]
            fill = self.seq_len + 1 - len(ids)
            rows.append(ids + [self.pad_id] * fill)
            is_response.append([False] * len(p) + [True] * (len(ids) - len(p)) + [False] * fill)
            is_fill.append([False] * len(ids) + [True] * fill)
        if n_cut:
            print(f"{self.name} {split}: {n_cut} of {len(self.splits[split])} pairs cut at "
                  f"seq_len={self.seq_len} ({len(self.splits[split]) - len(rows)} of them dropped: "
                  "no room for the response)")
        if not rows:
            raise ConfigError(f"{self.name} {split}: no pair fits in seq_len={self.seq_len} tokens")
        return torch.tensor(rows), torch.tensor(is_response), torch.tensor(is_fill)

    def training_tensors(self, split, loss_on_answer_only):
        """x, y (N, seq_len): inputs and next-token targets, IGNORE_INDEX on padding (and on the
        prompt if loss_on_answer_only); answer (N, seq_len) bool: x[i] is a response token."""
        rows, is_response, is_fill = self.rows(split)
        x, y = rows[:, :-1], rows[:, 1:].clone()
        learn = is_response[:, 1:] if loss_on_answer_only else ~is_fill[:, 1:]  # (N, seq_len)
        y[~learn] = IGNORE_INDEX
        return x, y, is_response[:, :-1]
