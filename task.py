"""
Tasks with verifiable answers (data/<name>/): load and tokenise them, make training batches,
grade answers.
JsonlTask: instruction data for fine-tuning a Llama, prompt/response pairs in a local JSONL file.
BenchmarkTask (at the end): a benchmark with verifiable answers for a Llama, prompt/answer rows in
local JSONL files.

A task folder holds prepare.py, which writes train.txt / val.txt / test.txt (one
"prompt<TAB>completion" per line) and meta.json (characters, mask and stop characters, lengths).
Each example becomes one fixed-length row: prompt, completion, the stop character, then more stop
characters as fill, so every row has the same length and the completion starts at the same place
in every row.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
from fractions import Fraction

import torch

from configurator import ConfigError
from model import IGNORE_INDEX
from tokenizer import Llama3Tokenizer

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def data_version(paths):
    """A short hash of these files' bytes. A checkpoint records it, so a model is never graded on,
    or resumed with, data other than what it was trained on (e.g. after a pull changed prepare.py
    and the data was made again)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def prepared_folder(name, made_file):
    """data/<name>/, its data made by its prepare.py on first use (nothing downloads) and again when
    a generator is newer than made_file (like make: a changed task must not meet old data)."""
    folder = os.path.join(DATA_DIR, name)
    prepare = os.path.join(folder, "prepare.py")
    if not os.path.exists(prepare):
        known = sorted(d for d in os.listdir(DATA_DIR)
                       if os.path.exists(os.path.join(DATA_DIR, d, "prepare.py")))
        raise ConfigError(f"unknown dataset {name!r}: no {prepare}. Known datasets: {known}")
    made = os.path.join(folder, made_file)
    # a variant task (data/addition_direct) runs another task's generator: any newer one counts
    generators = [os.path.join(DATA_DIR, d, "prepare.py") for d in os.listdir(DATA_DIR)]
    newest = max(os.path.getmtime(g) for g in generators if os.path.exists(g))
    if not os.path.exists(made) or newest > os.path.getmtime(made):
        print(f"preparing dataset {name} ...")
        subprocess.run([sys.executable, prepare], check=True)
    return folder


def task_of_checkpoint(checkpoint, checkpoint_path, tokenizer=None):
    """The task a checkpoint was trained on, refused if its data changed since: a data/ character
    task, or chat pairs (tokenizer: the checkpoint's, pretrained.tokenizer_of rebuilds it)."""
    if checkpoint["model_family"] == "llama":
        seq_len = checkpoint["config"]["seq_len"]
        task = JsonlTask(checkpoint["dataset"], tokenizer, seq_len)
    else:
        task = CharTask(checkpoint["dataset"])
    check_same_data(checkpoint, task, checkpoint_path)
    return task


def check_same_data(checkpoint, task, checkpoint_path):
    """Refuse a checkpoint trained on another version of the task's data. Checkpoints from before
    the version was recorded carry none and pass unchecked."""
    trained_on = checkpoint.get("data_version")
    if trained_on is not None and trained_on != task.data_version:
        raise ConfigError(f"{checkpoint_path} was trained on another version of the data in "
                         f"{task.name} (version {trained_on}; on disk now: {task.data_version}), "
                         "e.g. its prepare.py changed since. Its answers would be graded, or its "
                         "training resumed, on data it never saw: train it again "
                         "(init_from='scratch'), or check out the commit it was trained at")


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

    def rows(self, split):
        """(N, seq_len + 1) ids: chat prompt, response, the turn's end, padding; and two (N,
        seq_len + 1) bool masks: the response and its end (what the model must write), and the
        padding."""
        rows, is_response, is_fill, n_cut = [], [], [], 0
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


# -----------------------------------------------------------------------------
# benchmarks with verifiable answers for a Llama (evaluate.py --benchmark=<file>.jsonl)

# A number as people write it: digits with optional thousands separators (commas, or spaces before
# exactly three digits: "1 234"), optional decimals and an optional /denominator ("3/4"). A minus
# counts unless it joins two words or numbers ("3-4" is 3 and 4). A trailing period is never a
# decimal point: "1,234." is 1234.
NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:[, ]\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
LATEX_FRACTION = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}")  # \frac{3}{4} -> 3/4


def after_marker(text, marker):
    """The text after the last `marker` in text, or None if there is none. A marker followed by '{'
    (\\boxed{...}) gives what is inside its balanced braces (everything after '{' if they never
    close: a completion cut short)."""
    at = text.rfind(marker)
    if not marker or at < 0:
        return None
    rest = text[at + len(marker):]
    if not rest.startswith("{"):
        return rest
    depth = 0
    for i, c in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if depth == 0:
            return rest[1:i]
    return rest[1:]


def canonical_number(text):
    """'1,234' -> '1234', '$1,000.00' -> '1000', '0.50' and '1/2' -> '1/2': compare by value."""
    try:
        return str(Fraction(text.replace(",", "").replace(" ", "")))
    except (ValueError, ZeroDivisionError):  # '3/0'
        return None


def final_answer(text, marker="", numeric=True):
    """The answer a completion (or a reference) gives, as a canonical string, or None if none.

    Where: the text after the last `marker` ('####'), or inside the braces after it ('\\boxed');
    with no marker, or none in the text, the whole text (lm-eval's "flexible" extraction: a model
    that forgets the marker is still graded). numeric: the FIRST number after the marker, else the
    LAST number of the text, compared by value (canonical_number; LaTeX \\frac{a}{b} reads as a/b);
    no number -> None, which is never correct. numeric=False: the extracted text with spaces
    collapsed and surrounding '$', '.' and spaces removed.
    """
    part = after_marker(text, marker)
    scope = text if part is None else part
    if not numeric:
        return " ".join(scope.split()).strip(" .$") or None
    numbers = NUMBER.findall(LATEX_FRACTION.sub(r"\1/\2", scope))
    if not numbers:
        return None
    return canonical_number(numbers[0] if part is not None else numbers[-1])


def read_benchmark(path, grade):
    """A JSONL file of {"prompt": ..., "answer": ...} rows -> [(prompt, answer)]; an answer may be
    a JSON number. Other keys (e.g. "response", a reference solution) are ignored. An answer that
    grade(answer) cannot read is an error naming the file and line."""
    rows = read_jsonl(path, ("prompt", "answer"), "benchmark")
    for line_no, row in rows:
        if grade(row["answer"]) is None:
            raise ConfigError(f"{path}:{line_no}: the grader finds no answer in "
                              f"{row['answer'][:80]!r}")
    return [(row["prompt"], row["answer"]) for _, row in rows]


def held_out(rows, n, seed=0):
    """(n rows drawn with a fixed seed, the other rows), each in file order."""
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = set(order[:n])
    return ([r for i, r in enumerate(rows) if i in chosen],
            [r for i, r in enumerate(rows) if i not in chosen])


class BenchmarkTask:
    """A benchmark with verifiable answers for a chat model: JSONL files of {"prompt": ...,
    "answer": ...} rows.

    The model gets each prompt through chat_prompt (as in training and sample.py) and writes until
    a stop token; final_answer() reads the answer out of the completion and out of the reference
    alike, and the two must be equal. The interface is CharTask's, what evaluate.py uses: name,
    splits {"val", "test"}, encode_prompt, decode, is_correct, stop_ids, mask_id, max_new_tokens
    (evaluate.py cuts it per prompt to the model's context). γ is calibrated on val, never on test:
    val is val_problems rows drawn with seed 0 from val_path, or, without one, from the benchmark
    itself, whose other rows are then the test set (at most half of them go to val).
    tokenizer: a tokenizer object, or the path of a Llama 3 tokenizer.model.
    """

    def __init__(self, path, tokenizer, val_path=None, val_problems=200, max_new_tokens=512,
                 answer_marker="", numeric=True):
        self.tokenizer = as_tokenizer(tokenizer)
        self.name, self.max_new_tokens = os.path.basename(path), max_new_tokens
        self.answer_marker, self.numeric = answer_marker, numeric
        self.mask_id, self.stop_ids = self.tokenizer.mask_id, self.tokenizer.stop_ids
        # special tokens decode to text such as "<|reserved_special_token_12|>": never a number
        self.special_text = re.compile("|".join(re.escape(name)
                                                for name in self.tokenizer.special))
        grade = self.final_answer
        rows = read_benchmark(path, grade)
        if val_path:
            test_prompts = {prompt for prompt, _ in rows}
            val_rows = [r for r in read_benchmark(val_path, grade) if r[0] not in test_prompts]
            val, _ = held_out(val_rows, val_problems)
            test, source = rows, f"{len(val)} rows of {val_path} (seed 0; none a test prompt)"
        else:
            val, test = held_out(rows, min(val_problems, len(rows) // 2))
            source = (f"{len(val)} of the {len(rows)} rows of {path} (seed 0); the test set is the "
                      f"other {len(test)}")
        if not val or not test:
            raise ConfigError(f"{path}: {len(test)} test and {len(val)} val rows; need at least "
                              "one of each")
        self.splits = {"val": val, "test": test}
        self.info = dict(benchmark=os.path.abspath(path), val=source, answer_marker=answer_marker,
                         numeric=numeric, max_new_tokens=max_new_tokens)

    def encode_prompt(self, prompt):
        return chat_prompt(self.tokenizer, prompt)

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def final_answer(self, text):
        """The one answer extractor (final_answer above) with this benchmark's marker."""
        return final_answer(text, self.answer_marker, self.numeric)

    def is_correct(self, completion, reference):
        """The completion's final answer equals the reference's; no answer is never correct."""
        got = self.final_answer(self.special_text.sub(" ", completion))
        return got is not None and got == self.final_answer(reference)
