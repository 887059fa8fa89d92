"""The word-problem task (data/wordproblems/prepare.py) on small sizes: the same files every run,
splits disjoint by a problem's identity and alike in their mix of families and numbers, every step's
arithmetic right, the answer where evaluate.py's grader finds it, and wording that varies."""

import importlib.util
import json
import os
import re
import statistics
from collections import Counter

import pytest

from tasks import final_answer, read_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARE = os.path.join(ROOT, "data", "wordproblems", "prepare.py")
spec = importlib.util.spec_from_file_location("wordproblems", PREPARE)
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)

SIZES = dict(n_train=3000, n_val=200, n_test=600)
FAMILIES = [f.__name__ for f in prepare.FAMILIES]
STEP = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
       "/": lambda a, b: a / b}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(out_dir, {split: [Problem]}) from one run of main."""
    out_dir = tmp_path_factory.mktemp("wordproblems")
    return out_dir, prepare.main(out_dir=str(out_dir), **SIZES)


def read_rows(out_dir, split):
    with open(os.path.join(out_dir, f"{split}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def operands(problem):
    """The numbers a problem is made of (its identity less the family and the variant names)."""
    flat = [x for part in problem.key for x in (part if isinstance(part, tuple) else (part,))]
    return [x for x in flat if isinstance(x, int)]


def without_numbers(text):
    return re.sub(r"\d+", "#", text.strip())


def test_same_files_every_run(made, tmp_path):
    out_dir, _ = made
    prepare.main(out_dir=str(tmp_path), **SIZES)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "meta.json"):
        with open(os.path.join(out_dir, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name


def test_rows_are_prompt_response_answer_with_the_requested_counts(made):
    out_dir, _ = made
    for split in ("train", "val", "test"):
        rows = read_rows(out_dir, split)
        assert len(rows) == SIZES[f"n_{split}"]
        for row in rows:
            assert set(row) == {"prompt", "response", "answer"}
            assert all(isinstance(v, str) and v for v in row.values())
            assert re.fullmatch(r"[1-9]\d*", row["answer"])


def test_splits_are_disjoint_by_identity_whatever_the_names(made):
    _, splits = made
    keys = {split: [p.key for p in problems] for split, problems in splits.items()}
    for split, ks in keys.items():
        assert len(set(ks)) == len(ks), f"a problem appears twice in {split}"
        assert all(prepare.split_of(k) == split for k in ks)  # the hash picks the split
    assert not set(keys["test"]) & (set(keys["train"]) | set(keys["val"]))
    assert not set(keys["val"]) & set(keys["train"])
    # names and wording are not part of the identity: two tellings of one problem share a key
    assert all("Mia" not in str(k) and "dollars" not in str(k) for k in keys["train"])


def test_the_test_set_does_not_depend_on_the_other_splits_sizes(made, tmp_path):
    out_dir, _ = made
    prepare.main(out_dir=str(tmp_path), n_train=500, n_val=50, n_test=SIZES["n_test"])
    assert read_rows(tmp_path, "test") == read_rows(out_dir, "test")


def test_every_step_is_right_and_the_answer_is_the_last_result(made):
    out_dir, _ = made
    for split in ("train", "val", "test"):
        for row in read_rows(out_dir, split):
            *steps, last = row["response"].split("\n")
            assert 2 <= len(steps) <= 4, row["response"]
            for line in steps:
                found = STEP.findall(line)
                assert len(found) == 1, f"not one 'a op b = c' in {line!r}"
                a, op, b, c = found[0]
                assert OPS[op](int(a), int(b)) == int(c), line
            assert last == f"#### {row['answer']}"
            assert STEP.findall(steps[-1])[0][3] == row["answer"]


def test_evaluate_reads_the_files_and_grades_the_reference_as_right(made):
    """The rows are what evaluate.py --benchmark --answer_marker='####' reads, and its grader reads
    each reference solution's answer as the answer field."""
    out_dir, _ = made
    rows = read_benchmark(os.path.join(out_dir, "test.jsonl"), lambda t: final_answer(t, "####"))
    assert len(rows) == SIZES["n_test"]
    for row in read_rows(out_dir, "test"):
        assert final_answer(row["response"], "####") == row["answer"]
        assert final_answer(row["response"]) == row["answer"]  # no marker: the last number


def test_splits_have_the_same_mix_of_families_and_numbers(made):
    _, splits = made
    share = {split: Counter(p.family for p in problems) for split, problems in splits.items()}
    for family in FAMILIES:
        for split in ("val", "test"):
            assert abs(share[split][family] / len(splits[split])
                       - share["train"][family] / len(splits["train"])) < 0.01, (family, split)
    mean = {split: statistics.mean(x for p in problems for x in operands(p))
            for split, problems in splits.items()}
    assert abs(mean["test"] - mean["train"]) < 1.5, mean
    assert abs(mean["val"] - mean["train"]) < 3, mean  # val is small: a looser bound


def test_wording_varies(made):
    _, splits = made
    train = splits["train"]
    templates = Counter(p.template for p in train)
    assert len(templates) > len(train) / 3 and templates.most_common(1)[0][1] < 0.01 * len(train)
    # a step's wording with the numbers taken out: no one wording is more than 3% of all steps
    steps = Counter(without_numbers(line) for p in train for line in p.response.split("\n")[:-1])
    assert steps.most_common(1)[0][1] < 0.03 * sum(steps.values()), steps.most_common(3)
    assert len(steps) > 1000
    questions = Counter(without_numbers(re.findall(r"[^.?]*\?", p.prompt)[0]) for p in train)
    assert questions.most_common(1)[0][1] < 0.03 * len(train) and len(questions) > 300
    asks_first = sum(p.prompt.index("?") < p.prompt.index(".") for p in train)
    assert 0.35 < asks_first / len(train) < 0.65  # the question first in about half of the prompts
    names = Counter(w for p in train for w in re.findall(r"\b[A-Z][a-z]+\b", p.prompt))
    assert sum(name in names for name, _ in prepare.NAMES) == len(prepare.NAMES)


def test_lengths_suit_a_small_model(made):
    _, splits = made
    problems = [p for ps in splits.values() for p in ps]
    prompt = statistics.mean(len(p.prompt) for p in problems)
    response = statistics.mean(len(p.response) for p in problems)
    assert 150 <= prompt <= 350 and 100 <= response <= 250, (prompt, response)
    assert max(int(p.answer) for p in problems) <= 1000


def test_grammar_helpers():
    assert prepare.count(1, ("apple", "apples")) == "1 apple"
    assert prepare.count(3, ("loaf of bread", "loaves of bread")) == "3 loaves of bread"
    # the first slot names the person, whatever its kind; the later ones are pronouns
    text = "@His dog barks. @S laughs and @s feeds @him. Then @his cat comes."
    want = "Mia's dog barks. She laughs and she feeds her. Then her cat comes."
    assert prepare.fill(text, ("Mia", "f")) == want
    assert prepare.fill("@S runs. @His bag is red.", ("Omar", "m")) == "Omar runs. His bag is red."
