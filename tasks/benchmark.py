"""
Benchmarks with verifiable answers for a chat model (evaluate.py --benchmark=<file>.jsonl):
prompt/answer rows in local JSONL files, and the answer extractor that grades them.
"""

import os
import re
from fractions import Fraction

import torch

from configurator import ConfigError
from tasks.chat import as_tokenizer, chat_prompt, read_jsonl

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
