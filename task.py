"""
Tasks with verifiable answers (data/<name>/): load and tokenise them, make training batches, grade answers.
JsonlTask (at the end): instruction data for fine-tuning a Llama, prompt/response pairs in a local JSONL file.

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
from tokenizer import Llama3Tokenizer

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
        self.stop_ids = [self.stop_id]
        self.tokenizer_info = dict(kind="char", chars=self.chars)  # what a checkpoint records to decode
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

    def encode_prompt(self, prompt):
        """What the model is given to answer a problem (evaluate.py): here the prompt's characters."""
        return self.encode(prompt)

    @property
    def max_new_tokens(self):
        """The longest completion a row holds, its stop character included."""
        return self.seq_len - self.prompt_len

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


class JsonlTask:
    """Instruction data for a Llama: a local JSONL file with one {"prompt": "...", "response": "..."} per line.

    Each pair becomes one row of seq_len + 1 tokens in the Llama 3.1 chat format: a user turn and the open
    assistant header (tokenizer.encode_chat, as sample.py prompts), the response, <|eot_id|>, then
    <|finetune_right_pad_id|> as fill. Longer rows are cut at the end; a pair whose prompt alone fills the
    seq_len inputs is dropped. Unlike CharTask the response starts at a different place in every row: `answer`
    marks it, and train.py starts each row's noisy blocks at its first response token, as decoding starts its
    first block.
    The val split is a fixed 1% (at least one pair), drawn with a fixed seed.
    """

    def __init__(self, path, tokenizer_path, seq_len, val_fraction=0.01):
        if not os.path.exists(path):
            raise FileNotFoundError(f"no instruction data at {path}: expected a JSONL file with one "
                                    '{"prompt": "...", "response": "..."} object per line')
        if tokenizer_path is None or not os.path.exists(tokenizer_path):
            raise FileNotFoundError(f"no Llama tokenizer.model at {tokenizer_path} (it sits next to the weights)")
        self.name, self.seq_len = path, seq_len
        self.tokenizer = Llama3Tokenizer(tokenizer_path)
        self.tokenizer_info = dict(kind="llama", path=os.path.abspath(tokenizer_path))
        self.mask_id, self.stop_id = self.tokenizer.mask_id, self.tokenizer.eot_id
        self.stop_ids = self.tokenizer.stop_ids  # <|end_of_text|>, <|eom_id|>, <|eot_id|>
        self.pad_id = self.tokenizer.special["<|finetune_right_pad_id|>"]  # never produced by encoding text
        pairs = self._read(path)
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0)).tolist()
        n_val = max(1, round(val_fraction * len(pairs)))
        self.splits = {"train": [pairs[i] for i in order[n_val:]], "val": [pairs[i] for i in order[:n_val]]}

    def _read(self, path):
        pairs = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    pair = json.loads(line)
                except json.JSONDecodeError:
                    pair = None
                if not (isinstance(pair, dict) and all(isinstance(pair.get(k), str) for k in ("prompt", "response"))):
                    raise ValueError(f'{path}:{line_no}: expected {{"prompt": "...", "response": "..."}} '
                                     f"(two strings), got {line[:80]!r}")
                pairs.append((pair["prompt"], pair["response"]))
        if len(pairs) < 2:
            raise ValueError(f"{path}: found {len(pairs)} prompt/response pairs; need at least 2 (one is held out)")
        return pairs

    @property
    def vocab_size(self):
        return self.tokenizer.vocab_size

    def encode(self, text):
        return self.tokenizer.encode(text)

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def encode_prompt(self, prompt):
        """A user message -> chat-format ids ending with the open assistant header."""
        return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])

    def rows(self, split):
        """(N, seq_len + 1) ids: chat prompt, response, <|eot_id|>, padding; and (N, seq_len + 1) bool, True
        on the response and its <|eot_id|> (what the model must write)."""
        rows, is_response, n_cut = [], [], 0
        for prompt, response in self.splits[split]:
            p = self.encode_prompt(prompt)
            ids = p + self.encode(response.strip()) + [self.stop_id]
            n_cut += len(ids) > self.seq_len + 1
            if len(p) >= self.seq_len:  # no room for a single response token among the inputs
                continue
            ids = ids[:self.seq_len + 1]
            fill = self.seq_len + 1 - len(ids)
            rows.append(ids + [self.pad_id] * fill)
            is_response.append([False] * len(p) + [True] * (len(ids) - len(p)) + [False] * fill)
        if n_cut:
            print(f"{self.name} {split}: {n_cut} of {len(self.splits[split])} pairs cut at seq_len={self.seq_len} "
                  f"({len(self.splits[split]) - len(rows)} of them dropped: no room for the response)")
        if not rows:
            raise ValueError(f"{self.name} {split}: no pair fits in seq_len={self.seq_len} tokens")
        return torch.tensor(rows, dtype=torch.long), torch.tensor(is_response)

    def training_tensors(self, split, loss_on_answer_only):
        """x, y (N, seq_len): inputs and next-token targets, IGNORE_INDEX on padding (and on the prompt if
        loss_on_answer_only); answer (N, seq_len) bool: x[i] is a response token."""
        rows, is_response = self.rows(split)
        x, y = rows[:, :-1], rows[:, 1:].clone()
        learn = is_response[:, 1:] if loss_on_answer_only else rows[:, 1:] != self.pad_id  # (N, seq_len)
        y[~learn] = IGNORE_INDEX
        return x, y, is_response[:, :-1]
