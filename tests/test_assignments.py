"""
The course assignments (assignments/): handouts made by handout.py and graded by grade.py, checked
as course staff need them to be. Handouts are made once per module into a temporary directory:

- a stub never passes: on a handout where only assignment n is blanked, every test of n fails, and
  fails with the NotImplementedError naming assignment n (not with an import error or a renamed
  test), and the handout's blank answers.toml earns no question's points;
- no assignment needs a later one, and the reference gets full points: n's tests pass, in under
  20 s, on a handout where only the assignments after n are blanked (the code they run is the
  reference's), and the reference's answers (answers_reference.toml) earn every question's points;
- no solution leaks: no line of a blanked body (20 characters or more once whitespace is removed,
  with or without its comment) appears in a handout more often than the code the handout keeps has
  it anyway (a line such as a call of a given helper may also stand in a given function); the
  bodies are found here with ast, independently of handout.py. Nor does a renamed or reformatted
  copy: no run of RUN syntax-tree nodes of a blanked body (its own names and constants abstracted)
  stands in another function, module top level or Markdown code span of a handout's non-test
  files, and the check is shown to find a planted renamed copy of every body it can see;
- the graded questions: every stored digest is that of the answer the reference code computes
  (answer_N_I below), answers_reference.toml agrees, the student's answers.toml is blank and scores
  0, each write-up asks its questions;
- a handout imports cleanly: its modules import (train.py and sample.py are scripts that run on
  import, so every .py file is compiled instead), its tests collect, and the main command
  (train.py, tiny settings, with the report on 2 problems so that decoding runs too) either runs
  through or fails with the NotImplementedError of an assignment the handout blanks;
- the list is consistent: write-ups exist and name their functions, SPECS only fills missing
  docstrings;
- a write-up says what the code and the grader do: the signature block under "## What to write"
  holds exactly the blanked functions, each with the signature inspect.signature finds in the code
  and a docstring of shapes that a call of the reference satisfies; "N tests (M cases)" is what
  grade.py collects; the title's points are the list's; "about N lines of code to write" is what
  handout.py --measure counts, within 20%. Each check is shown to fail on a write-up changed to
  say something else.
Every subprocess runs with OMP_NUM_THREADS=1.
"""

import ast
import builtins
import dataclasses
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
import torch

import exact
import generate
import model as model_lib
import sampling
import sbd
from pretrained.load_llama import hf_permute
from tiny_models import random_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name, file):
    """A module of assignments/ by its path (they import each other by name, not as a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "assignments", file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load("course_list", "assignments.py")
grader = load("course_grade", "grade.py")
handout = load("course_handout", "handout.py")
IMPLEMENTED = [a["number"] for a in course.ASSIGNMENTS if a["kind"] == "implementation"]
BY_NUMBER = {a["number"]: a for a in course.ASSIGNMENTS}
ON_MAIN_PATH = {1, 2, 3, 4, 5}  # what train.py config/sbd_small.py runs (never a Llama: not 6)
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, cwd, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def make_handout(dest, numbers):
    """-> (directory, blanked assignment numbers, the files handout.py wrote, relative to the
    directory)."""
    done = run([os.path.join(ROOT, "assignments", "handout.py"), str(dest),
                "--assignments", ",".join(map(str, numbers))], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    files = [os.path.relpath(os.path.join(folder, f), dest)
             for folder, _, names in os.walk(dest) for f in names]
    return dest, numbers, files


@pytest.fixture(scope="module")
def handouts(tmp_path_factory):
    """{name: make_handout(...)} for 'only n', 'after n' (n before the last) and 'all'."""
    base = tmp_path_factory.mktemp("handouts")
    made = {f"only {n}": make_handout(base / f"only_{n}", [n]) for n in IMPLEMENTED}
    for n in IMPLEMENTED[:-1]:
        made[f"after {n}"] = make_handout(base / f"after_{n}", [m for m in IMPLEMENTED if m > n])
    made["all"] = make_handout(base / "all", IMPLEMENTED)
    return made


REFERENCE_ANSWERS = os.path.join(ROOT, "assignments", "answers_reference.toml")


def grade(root, numbers, tmp_path, answers=None):
    """Run root's grade.py (with its own answers.toml, or `answers`) -> (Gradescope results dict,
    printed table)."""
    results = tmp_path / f"results_{'_'.join(map(str, numbers))}.json"
    done = run([os.path.join(root, "assignments", "grade.py"), "--assignments",
                ",".join(map(str, numbers)), "--json", str(results)]
               + (["--answers", answers] if answers else []),
               cwd=tmp_path, timeout=600)  # from another directory: it finds its root
    assert results.exists(), done.stdout + done.stderr
    return json.loads(results.read_text()), done.stdout

# -----------------------------------------------------------------------------
# grading


def is_question(entry):
    return ": question " in entry["name"]


@pytest.mark.parametrize("n", IMPLEMENTED)
def test_a_stub_never_passes(n, handouts, tmp_path):
    """A stub scores 0: every test fails with the assignment's NotImplementedError, and the
    handout's blank answers.toml earns no question's points."""
    results, table = grade(handouts[f"only {n}"][0], [n], tmp_path)
    assert results["score"] == 0, table
    questions = [t for t in results["tests"] if is_question(t)]
    assert len(questions) == len(course.QUESTIONS[n]) >= 2, table
    assert all(t["output"].startswith("not answered") for t in questions), table
    for t in results["tests"]:
        if not is_question(t):
            assert "NotImplementedError" in t["output"] and f"assignment {n}: " in t["output"], t


@pytest.mark.parametrize("n", IMPLEMENTED)
def test_full_points_without_any_later_assignment(n, handouts, tmp_path):
    """n's tests pass, in under 20 s, on a handout where every assignment after n is blanked: so
    they need nothing later, and they pass on the reference (the code they run is the
    reference's). After the last assignment nothing is blanked: its handout is the repository
    itself."""
    root = handouts[f"after {n}"][0] if n != IMPLEMENTED[-1] else ROOT
    results, table = grade(root, [n], tmp_path, answers=REFERENCE_ANSWERS)
    assert results["score"] == BY_NUMBER[n]["points"], table
    assert all(t["score"] == t["max_score"] for t in results["tests"]), table
    assert len(results["tests"]) == len(BY_NUMBER[n]["tests"]) + len(course.QUESTIONS[n])
    assert results["extra_data"]["seconds"][str(n)] < 20, table

# -----------------------------------------------------------------------------
# what a handout holds


def squeeze(line):
    return "".join(line.split())  # whitespace removed: reformatting a line does not hide it


def pieces(line):
    """What the leak check looks for: the line and its code without the comment, whitespace
    removed."""
    return {p for p in (squeeze(line), squeeze(line.split("  #")[0])) if len(p) >= 20}


def body_of(text, qualname):
    """(first, end): 0-based line range of a function's body after its docstring, found with
    ast."""
    node = ast.parse(text)
    for part in qualname.split("."):
        node = next(n for n in node.body if getattr(n, "name", None) == part)
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body[0].lineno - 1, node.end_lineno


def leaks(directory, numbers, files):
    """Lines of the bodies blanked for `numbers` that `files` (in directory) hold more often than
    the code a handout keeps (the reference files without those bodies)."""
    blanked = {}  # {file: [qualname, ...]}
    for n in numbers:
        for function in BY_NUMBER[n]["functions"]:
            path, qualname = function.split(":")
            blanked.setdefault(path, []).append(qualname)
    in_handout, kept, bodies = Counter(), Counter(), []
    for path in files:
        with open(os.path.join(directory, path), encoding="utf-8", errors="replace") as f:
            in_handout.update(p for line in f.read().splitlines() for p in pieces(line))
        if not os.path.exists(os.path.join(ROOT, path)):
            continue  # assignments/handout.json
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        spans = [body_of("\n".join(lines), qualname) for qualname in blanked.get(path, [])]
        bodies += [(path, lines[i]) for first, end in spans for i in range(first, end)]
        kept.update(p for i, line in enumerate(lines)
                    if not any(first <= i < end for first, end in spans) for p in pieces(line))
    return [f"{path}: {line.strip()}" for path, line in bodies
            if any(in_handout[p] > kept[p] for p in pieces(line))]


def test_no_solution_leaks(handouts, tmp_path):
    for name, (directory, numbers, files) in handouts.items():
        assert leaks(directory, numbers, files) == [], f"handout {name!r}"
    reference = open(os.path.join(ROOT, "sampling.py")).read()
    (tmp_path / "sampling.py").write_text(reference)  # the check can fail: the file as it is,
    assert len(leaks(tmp_path, [4], ["sampling.py"])) >= 5  # 'handed out' with assignment 4


# The structural check: a copy with its variables renamed, reformatted or without comments. A body
# and every unit of the handout (a function or method, a module's top-level code, a code span of a
# Markdown file) become the pre-order sequence of their syntax tree's nodes, with the unit's own
# names (parameters, assigned names) and every constant abstracted, and the rest kept: node types,
# attribute and keyword names (torch's API), names of the module's globals (helpers, imports). A
# leak is a run of RUN consecutive nodes of a blanked body in another unit. Ordinary code shares at
# most 13 with a body (block_forward and train.py's get_batch: a torch.cat and two slices); a
# renamed copy of a statement or two is longer. Bodies of fewer than RUN nodes (the one-line masks,
# entropy) are left to the line check above.
RUN = 16
SHARED = {  # (blanked body, unit of the handout): why the run they share is not a solution
    ("generate.py:sbd_generate", "generate.py:ntp_generate"):
        "the decoders' common start: check the prompt, make the cache, prefill, the stop ids",
    ("generate.py:sbd_generate", "exact.py:exact_generate"):
        "the decoders' common start: check the mask id and the prompt, make the cache, prefill",
}


def structure(nodes, own):
    """Pre-order node tokens of a list of statements; names in `own` and constants abstracted."""
    out = []

    def visit(node):
        if isinstance(node, ast.expr_context):
            return
        if isinstance(node, ast.Name):
            out.append("name" if node.id in own else node.id)
        elif isinstance(node, ast.arg):
            out.append("arg")
        elif isinstance(node, ast.Constant):
            out.append("constant")
        elif isinstance(node, ast.Attribute):
            out.append("." + node.attr)
        elif isinstance(node, ast.keyword):
            out.append(f"{node.arg}=")
        else:
            out.append(type(node).__name__)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in nodes:
        visit(node)
    return out


def own_names(node):
    """The names a unit binds: parameters and assigned names (of nested functions too)."""
    return ({n.id for n in ast.walk(node) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store)} | {n.arg for n in ast.walk(node)
                                                  if isinstance(n, ast.arg)})


def python_units(tree, prefix=""):
    """(qualname, statements, own names) of every function and method, and of the top level."""
    if not prefix:
        top = [n for n in tree.body if not isinstance(n, handout.DEFINITIONS)]
        yield "", top, own_names(ast.Module(body=top, type_ignores=[]))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node.body, own_names(node)
        elif isinstance(node, ast.ClassDef):
            yield from python_units(node, prefix + node.name + ".")


CODE_SPANS = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`|((?:^(?: {4}|\t).*\n?)+)", re.M | re.S)


def markdown_units(text, known):
    """(index, statements, own names) of each code span of a Markdown text that parses as Python:
    fenced and indented blocks (or, if a block does not parse, each of its lines) and inline code;
    every name but the repository's globals (known) counts as the snippet's own."""
    for i, found in enumerate(CODE_SPANS.finditer(text)):
        code = textwrap.dedent(next(g for g in found.groups() if g is not None)).replace("·", "*")
        for j, piece in enumerate([code] + code.splitlines()):
            try:
                tree = ast.parse(piece.strip() if j else piece)
            except SyntaxError:
                continue
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - known
            yield f"code span {i}", tree.body, names | own_names(tree)
            if j == 0:
                break


def structural_leaks(directory, numbers, files):
    """Where the handout's non-test files (in directory) hold a run of RUN nodes of a body blanked
    for `numbers` -> ["file:qualname: in file:unit"], less the SHARED pairs."""
    grams, known = {}, set(dir(builtins))
    sources = {}
    for path in files:
        if path.startswith("tests/") or not path.endswith((".py", ".md")):
            continue
        with open(os.path.join(directory, path), encoding="utf-8", errors="replace") as f:
            sources[path] = f.read()
        if path.endswith(".py"):
            tree = ast.parse(sources[path])
            known |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                      if isinstance(t, ast.Name)}
            known |= {n.name for n in tree.body if isinstance(n, handout.DEFINITIONS)}
            known |= {(a.asname or a.name).split(".")[0] for n in tree.body
                      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    for path, text in sources.items():
        units = (python_units(ast.parse(text)) if path.endswith(".py")
                 else markdown_units(text, known))
        for name, nodes, own in units:
            tokens = structure(nodes, own)
            for i in range(len(tokens) - RUN + 1):
                grams.setdefault(tuple(tokens[i:i + RUN]), set()).add(f"{path}:{name}")
    found = []
    for n in numbers:
        for function in BY_NUMBER[n]["functions"]:
            path, qualname = function.split(":")
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                node = handout.find_function(ast.parse(f.read()), qualname)
            body = node.body[1:] if handout.docstring_of(node) is not None else node.body
            tokens = structure(body, own_names(node))
            where = set().union(*(grams.get(tuple(tokens[i:i + RUN]), set())
                                  for i in range(len(tokens) - RUN + 1)))
            found += [f"{function}: in {unit}" for unit in sorted(where)
                      if (function, unit) not in SHARED]
    return found


def test_no_structural_copy_of_a_solution(handouts):
    for name, (directory, numbers, files) in handouts.items():
        assert structural_leaks(directory, numbers, files) == [], f"handout {name!r}"


class Rename(ast.NodeTransformer):
    """A disguised copy: every parameter and assigned name becomes v0, v1, ..."""

    def __init__(self, own):
        self.names = {name: f"v{i}" for i, name in enumerate(sorted(own))}

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.names.get(node.arg, node.arg)
        return node


def test_the_structural_check_finds_a_renamed_copy(tmp_path):
    """A file with a renamed, reformatted copy of every blanked body (comments and docstring gone)
    and a Markdown file with one as a code block are each found; the one-line bodies shorter than
    RUN nodes are exactly those the check leaves to the line check."""
    copies, small = [], []
    for function in (f for n in IMPLEMENTED for f in BY_NUMBER[n]["functions"]):
        path, qualname = function.split(":")
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            node = handout.find_function(ast.parse(f.read()), qualname)
        node.body = node.body[1:] if handout.docstring_of(node) is not None else node.body
        if len(structure(node.body, own_names(node))) < RUN:
            small.append(function)
            continue
        node = Rename(own_names(node)).visit(node)
        node.name, node.decorator_list = f"helper_{len(copies)}", []
        copies.append((function, ast.unparse(node)))
    assert sorted(small) == ["model.py:causal_mask", "sampling.py:entropy", "sbd.py:block_id",
                             "sbd.py:hybrid_mask"]
    (tmp_path / "planted.py").write_text("\n\n".join(code for _, code in copies) + "\n")
    found = structural_leaks(tmp_path, IMPLEMENTED, ["planted.py"])
    assert {f.split(": in ")[0] for f in found} == {function for function, _ in copies}
    assert all(": in planted.py:helper_" in f for f in found), found
    decode_block = next(code for function, code in copies if function.endswith(":decode_block"))
    (tmp_path / "notes.md").write_text(f"A loop:\n\n```python\n{decode_block}\n```\n")
    found = structural_leaks(tmp_path, [5], ["notes.md"])
    assert found == ["generate.py:decode_block: in notes.md:code span 0"], found


def test_handout_imports_collects_and_keeps_the_rest(handouts):
    directory = handouts["all"][0]
    for folder, _, files in os.walk(directory):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path) as fh:
                    compile(fh.read(), path, "exec")  # scripts too (train.py runs on import)
    done = run(["-c", "import model, sbd, pretrained.load_llama, tasks, pretrained.tokenizer, "
                      "configurator, evaluate"],
               cwd=directory)
    assert done.returncode == 0, done.stderr
    done = run(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
               cwd=directory)
    assert done.returncode == 0, done.stdout[-3000:]
    # unblanked files: as they are
    for f in ("train.py", "README.md", "tests/test_model.py", "assignments/grade.py"):
        with open(os.path.join(ROOT, f)) as a, open(os.path.join(directory, f)) as b:
            assert a.read() == b.read(), f
    assert not os.path.exists(os.path.join(directory, ".git"))
    assert not os.path.exists(os.path.join(directory, ".venv"))
    assert not any(os.path.exists(os.path.join(directory, f)) for f in course.STAFF_ONLY)


@pytest.fixture(scope="module")
def addition_data(handouts):
    """train.py makes data/addition on first use (~3 s); the handouts share one copy, made here
    once."""
    directory = handouts["all"][0]
    done = run(["data/addition/prepare.py"], cwd=directory)
    assert done.returncode == 0, done.stderr
    return os.path.join(directory, "data", "addition")


@pytest.mark.parametrize("name", ["all"] + [f"only {n}" for n in IMPLEMENTED])
def test_main_command_fails_only_with_the_assignment(name, handouts, addition_data, tmp_path):
    directory, numbers, _ = handouts[name]
    for f in os.listdir(addition_data):
        if not os.path.exists(os.path.join(directory, "data", "addition", f)):
            shutil.copy(os.path.join(addition_data, f),
                        os.path.join(directory, "data", "addition", f))
    done = run(["train.py", "config/sbd_small.py", f"--out_dir={tmp_path}", "--ntp_iters=2",
                "--sbd_iters=2", "--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=8",
                "--sbd_batch_size=8", "--eval_interval=100", "--report_problems=2"], cwd=directory)
    if not set(numbers) & ON_MAIN_PATH:
        assert done.returncode == 0, done.stderr[-3000:]
        return
    last = done.stderr.strip().splitlines()[-1]
    found = re.fullmatch(r"NotImplementedError: assignment (\d+): \S+", last)
    assert done.returncode != 0 and found and int(found.group(1)) in numbers, done.stderr[-3000:]

# -----------------------------------------------------------------------------
# the graded questions: each answer computed again from the reference code


def two_outcome(h):
    """A distribution over two tokens (float64) with entropy h nats (0 <= h < log 2)."""
    lo, hi = 0.0, 0.5
    for _ in range(200):  # bisection on the smaller probability
        mid = (lo + hi) / 2
        if -(mid * math.log(mid) + (1 - mid) * math.log(1 - mid)) < h:
            lo = mid
        else:
            hi = mid
    return torch.tensor([1 - lo, lo], dtype=torch.float64)


ALL = torch.ones(1, 8, dtype=torch.bool)


def answer_1_1():  # the keys of noisy slot 10: L = 6, k = 3, phase 1
    mask = sbd.sbd_training_mask(torch.tensor(10), torch.arange(12), 6, 3, 1)  # (12,)
    return mask.nonzero()[:, 0].tolist()


def answer_1_2():  # True entries of the decoding mask: 3 cached, 2 committed, a block of 3
    mask = model_lib.dense_mask(lambda q, kv: sbd.hybrid_mask(q, kv, 5), 5, 8, query_offset=3)
    return int(mask.sum())


def answer_1_3():  # the noisy slots that see no clean key: L = 6, k = 3, phase 1
    q = torch.arange(6, 12)[:, None]
    mask = sbd.sbd_training_mask(q, torch.arange(6)[None, :], 6, 3, 1)
    return q[:, 0][~mask.any(dim=1)].tolist()


def answer_2_1():  # T and the noisy half's positions: L = 10, k = 4, phase 3, maskable from 6
    x = torch.arange(10, 20)[None]
    maskable = (torch.arange(10) >= 6)[None]
    idx, pos, _, _ = sbd.sbd_inputs(x, x + 1, 99, 4, torch.tensor([3]), maskable,
                                    torch.Generator().manual_seed(0))
    return [idx.size(1)] + pos[10:].tolist()


def answer_2_2():  # Eq. 14 at ntp_weight 1, 0.5, 0: clean nll 1, 2, 3; noisy nll 0.5, 1.5
    nll = {0: 1.0, 1: 2.0, 2: 3.0, 5: 0.5, 6: 1.5}  # slot: its loss; L = 4, T = 7
    labels, logits = torch.full((1, 7), -1), torch.zeros(1, 7, 2, dtype=torch.float64)
    for slot, value in nll.items():
        labels[0, slot] = 0
        logits[0, slot] = torch.tensor([-value, math.log(1 - math.exp(-value))])
    return [sbd.sbd_loss(logits, labels, 4, ntp_weight=w)[0].item() for w in (1.0, 0.5, 0.0)]


def answer_2_3():  # P(a block of 8 maskable tokens all masked): η ~ U(0, 1), η = 0.5
    _, is_masked = sbd.add_noise(torch.zeros(100_000, 8, dtype=torch.long), 1,
                                 generator=torch.Generator().manual_seed(0))
    assert abs(is_masked.all(dim=1).double().mean().item() - 1 / 9) < 0.005  # add_noise agrees
    return [1 / 9, 0.5 ** 8]  # the integral of η^8 over [0, 1], and 0.5^8


def answer_3_1():  # cache lengths after forwards (T, n_commit) on 5 of max_len 12; -1: refused
    cache = model_lib.KVCache(1, 1, 1, 2, max_len=12, device="cpu", dtype=torch.float32)
    cache.length, lengths = 5, []
    for T, n_commit in [(4, 2), (3, 0), (6, 3), (5, 5)]:
        try:
            cache.extend(0, torch.ones(1, 1, T, 2), torch.ones(1, 1, T, 2), n_commit)
        except ValueError:
            lengths.append(-1)
            continue
        cache.commit(n_commit)
        lengths.append(cache.length)
    return lengths


def answer_3_2():  # bytes of Llama-3.1-8B's bf16 KV cache: 8192 tokens, and a block of 16
    c = model_lib.LlamaConfig()
    per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2  # K and V, 2 bytes each
    return [8192 * per_token, 16 * per_token]


def answer_4_1():  # reveal_entropy on entropies [0.3, 0.05, 0.2, 0, 0.4, 0.1], γ = 0.3
    probs = torch.stack([two_outcome(h) for h in [0.3, 0.05, 0.2, 0.0, 0.4, 0.1]])[None]
    return sampling.reveal_entropy(probs, ALL[:, :6], 0.3)[0].nonzero()[:, 0].tolist()


def answer_4_2():  # Eq. 18 on entropies [0.1, 0.5, 0.2, 0.3] in confidence order, γ = 0.5
    h_sorted = torch.tensor([[0.1, 0.5, 0.2, 0.3]], dtype=torch.float64)
    return int(sampling.entropy_bound(h_sorted, ALL[:, :4], 0.5).sum())


def answer_4_3():  # the factor rule on confidences [0.99, 0.9, 0.95, 0.7, 0.85], f = 1
    probs = torch.tensor([[c, 1 - c] for c in [0.99, 0.9, 0.95, 0.7, 0.85]],
                         dtype=torch.float64)[None]
    return sampling.reveal_factor(probs, ALL[:, :5], 1.0)[0].nonzero()[:, 0].tolist()


def answer_5_1():  # widths of Algorithm 3's forwards: a second block of 8, fixed entropies, γ 0.12
    entropies = [0.0, 0.02, 0.5, 0.01, 0.3, 0.05, 0.9, 0.02]  # slot 0 comes from NTP
    probs = torch.stack([two_outcome(h) for h in entropies])[None]
    is_masked, widths = ALL.clone(), []
    is_masked[0, 0] = False
    while is_masked.any():
        widths.append(8 + 8 if not widths else 8)  # the first forward also commits the last block
        is_masked &= ~sampling.reveal_entropy(probs, is_masked, 0.12)
    return widths


def answer_5_2():  # Eq. 16, k = 16 in 4 forwards: time(n) flat, and time(16) 1.4, time(32) 1.9
    def speedup(k, forwards, time):
        return k * time(1) / (time(2 * k) + (forwards - 1) * time(k))

    return [speedup(16, 4, lambda n: 1.0), speedup(16, 4, {1: 1.0, 16: 1.4, 32: 1.9}.get)]


def answer_5_3():  # exact mode: drafts [5, 9, 2, 7], NTP's argmaxes [5, 9, 3, 7, 1]
    drafts, causal = torch.tensor([[5, 9, 2, 7]]), torch.zeros(1, 5, 12)
    causal[0, torch.arange(5), torch.tensor([5, 9, 3, 7, 1])] = 1.0
    ok, targets = exact.accept_greedy(drafts, causal, 11)
    n_ok = int(exact.leading(ok, torch.tensor([4]))[0])
    return drafts[0, :n_ok].tolist() + [int(targets[0, n_ok])]


def answer_5_4():  # cache.length after each forward: prompt of 6, k = 4, blocks in 3 and 2
    m = random_model("gpt-tiny")
    prompt = torch.randint(0, 60, (1, 6), generator=torch.Generator().manual_seed(0))
    cache = generate.new_cache(m, prompt, 8)
    prev, _ = generate.prefill(m, prompt, cache)
    block, lengths = torch.full((1, 4), 63), []
    with torch.no_grad():
        for forwards in (3, 2):
            generate.hybrid_forward(m, cache, torch.cat([prev, block], dim=1), prev.size(1))
            lengths.append(cache.length)
            for _ in range(forwards - 1):
                generate.hybrid_forward(m, cache, block, 0)
                lengths.append(cache.length)
            prev = block
    return lengths


def answer_6_1():  # hf_permute's row order: 2 heads of head_dim 6
    return hf_permute(torch.arange(12.0)[:, None], 2)[:, 0].long().tolist()


def answer_6_2():  # Llama 3.1's scaling at head_dim 64: frequencies kept, interpolated, divided
    scaled = model_lib.LlamaConfig(dim=2048, n_heads=32)
    f = model_lib.rope_frequencies(scaled).double()
    base = model_lib.rope_frequencies(dataclasses.replace(scaled, use_scaled_rope=False)).double()
    kept = torch.isclose(f, base, rtol=1e-6)
    divided = torch.isclose(f, base / scaled.rope_scale_factor, rtol=1e-6)
    return [int(kept.sum()), int((~kept & ~divided).sum()), int(divided.sum())]


def answer_6_3():  # apply_rotary: x = [1, 0, 0, 1], frequencies [1, 0.5], position 3
    cos, sin = model_lib.rotary_cos_sin(torch.tensor([3]), torch.tensor([1.0, 0.5]))
    x = torch.tensor([1.0, 0.0, 0.0, 1.0]).view(1, 1, 1, 4)
    return model_lib.apply_rotary(x, cos, sin).flatten().tolist()


QUESTION_ANSWERS = {f"{name[7]}.{name[9]}": f for name, f in globals().items()
                    if re.fullmatch(r"answer_\d_\d", name)}


def reference_answers():
    return grader.read_answers(REFERENCE_ANSWERS)


def test_question_answers_are_the_reference_codes():
    """Every stored digest is that of the answer the reference code gives now (a change of the
    code that changes an answer fails here), and answers_reference.toml says the same."""
    stored = reference_answers()
    questions = [q for n in IMPLEMENTED for q in course.QUESTIONS[n]]
    assert sorted(QUESTION_ANSWERS) == sorted(q["id"] for q in questions) == sorted(stored)
    for q in questions:
        text = grader.canonical(q["kind"], QUESTION_ANSWERS[q["id"]]())
        assert text == grader.canonical(q["kind"], stored[q["id"]]), q["id"]
        assert grader.digest(q, text) == q["digest"], f"question {q['id']}: the digest is stale"


def test_questions_are_asked_and_graded():
    """2-4 questions per implementation assignment, each asked in its write-up and blank in the
    student's answers.toml; the blank form earns 0, the reference's answers full points, and a
    wrong answer 0."""
    form = grader.read_answers(os.path.join(ROOT, "assignments", "answers.toml"))
    assert sorted(form) == sorted(reference_answers())
    assert all(value == [] for value in form.values())
    for n in IMPLEMENTED:
        a = BY_NUMBER[n]
        assert 2 <= len(course.QUESTIONS[n]) <= 4
        section = writeup(a).split("## Graded questions", 1)[1].split("\n## ", 1)[0]
        for q in course.QUESTIONS[n]:
            assert re.search(rf"^\*\*{re.escape(q['id'])}\*\* ", section, re.M), (
                f"{a['writeup']} does not ask question {q['id']}")
        assert sum(e["score"] for e in grader.grade_questions(a, form)) == 0
        entries = grader.grade_questions(a, reference_answers())
        assert all(e["score"] == e["max_score"] == 1 for e in entries)
        wrong = {qid: (v + 1 if not isinstance(v, list) else [v[0] + 1] + v[1:])
                 for qid, v in reference_answers().items()}
        assert sum(e["score"] for e in grader.grade_questions(a, wrong)) == 0
    assert grader.canonical("numbers:2", [-0.001, 2.0]) == "0.00,2.00"
    assert grader.canonical("ints", [1.5]) is None and grader.canonical("ints", "3") is None

# -----------------------------------------------------------------------------
# the list itself


def writeup(a):
    with open(os.path.join(ROOT, "assignments", a["writeup"]), encoding="utf-8") as f:
        return f.read()


def test_the_list_is_consistent():
    assert [a["number"] for a in course.ASSIGNMENTS] == list(range(1, len(course.ASSIGNMENTS) + 1))
    assert len(IMPLEMENTED) >= 6 and len(course.ASSIGNMENTS) - len(IMPLEMENTED) >= 3
    functions = [f for a in course.ASSIGNMENTS for f in a["functions"]]
    assert len(functions) == len(set(functions)), "a function in two assignments"
    assert set(course.SPECS) <= set(functions)
    with open(os.path.join(ROOT, "assignments", "README.md")) as f:
        index = f.read()
    for a in course.ASSIGNMENTS:
        assert all(b < a["number"] for b in a["builds_on"])
        assert a["writeup"] in index, f"assignments/README.md does not link {a['writeup']}"
        text = writeup(a)
        for name in a["functions"]:
            assert name in text, f"{a['writeup']} does not mention {name}"
        assert bool(a["tests"]) == (a["kind"] == "implementation")

# -----------------------------------------------------------------------------
# the write-ups against the code and the grader

# the signature block: the first ```python block of the section "## What to write"
BLOCK = re.compile(r"^## What to write\n(?:(?!^## ).)*?^```python\n(.*?)^```", re.M | re.S)
FILE_COMMENT = re.compile(r"# (\S+\.py)")
TITLE = re.compile(r"# Assignment (\d+): .*\((\d+) points\)")
COUNTS = re.compile(r"(\d+)\s+tests\s+\((\d+)\s+cases\)")  # a phrase may wrap: \s+
SIZE = re.compile(r"about\s+(\d+)\s+lines\s+of\s+code\s+to\s+write;\s+(\d+)\s+lines\s+of\s+given"
                  r"\s+helpers\s+to\s+call")
ITEM = re.compile(r"(\w+)(?:\s*\((.*)\))?(?:\s+(bool|long|float))?")
DTYPES = {"bool": lambda t: t.dtype == torch.bool, "long": lambda t: t.dtype == torch.long,
          "float": lambda t: t.is_floating_point()}


def stated_functions(text):
    """{'file:qualname': (stub function, its docstring)} of a write-up's signature block. The
    block is Python: '# file.py' comment lines name the file of the definitions below them, each
    function has the signature of the code and a docstring of shapes, methods sit in their class."""
    found = BLOCK.search(text)
    if found is None:
        raise ValueError("no ```python block under '## What to write'")
    block = found.group(1)
    tree = ast.parse(block)
    namespace = {}
    exec(compile(tree, "<signature block>", "exec"), namespace)
    files = {i + 1: m.group(1) for i, line in enumerate(block.splitlines())
             if (m := FILE_COMMENT.fullmatch(line.strip()))}
    stated = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            defs = [(f, f"{node.name}.{f.name}") for f in node.body
                    if isinstance(f, ast.FunctionDef)]
        else:
            defs = [(node, node.name)] if isinstance(node, ast.FunctionDef) else []
        above = [line for line in files if line < node.lineno]
        for f, qualname in defs:
            if not above:
                raise ValueError(f"{qualname}: no '# file.py' line above it")
            stub = namespace
            for part in qualname.split("."):
                stub = stub[part] if isinstance(stub, dict) else getattr(stub, part)
            stated[f"{files[max(above)]}:{qualname}"] = (stub, ast.get_docstring(f) or "")
    return stated


def code_function(name):
    """The function of the repository that 'file:qualname' names."""
    path, qualname = name.split(":")
    found = importlib.import_module(path[:-3].replace("/", "."))
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def parse_items(side):
    """'x (B, L) long, y, mask (T, T) bool' -> [(name, dims or None, dtype or None)]."""
    items, depth, current = [], 0, ""
    for char in side + ",":
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            match = ITEM.fullmatch(current.strip())
            if match is None:
                raise ValueError(f"cannot read {current.strip()!r} (want: name (dims) dtype)")
            name, dims, dtype = match.groups()
            dims = None if dims is None else [d.strip() for d in dims.split(",") if d.strip()]
            items.append((name, dims, dtype))
            current = ""
        else:
            current += char
    return items


def shape_problems(function, doc, kwargs, symbols):
    """What is wrong with doc ('inputs -> outputs') for a call function(**kwargs) of the
    reference. Input dims that are plain names bind to the sizes of the arguments (as do int
    arguments of that name); every other dim is evaluated with those bindings and symbols."""
    if doc.count("->") != 1:
        return [f"its docstring {doc!r} is not 'inputs -> outputs'"]
    inputs, outputs = (parse_items(" ".join(side.split())) for side in doc.split("->"))
    parameters = inspect.signature(function).parameters
    problems = [f"input {name!r} is no parameter of the code"
                for name, _, _ in inputs if name not in parameters]
    symbols = dict(symbols)
    symbols.update({n: v for n, v in kwargs.items() if type(v) is int})
    shaped = [(name, dims, dtype, kwargs.get(name))
              for name, dims, dtype in inputs if dims is not None]
    for _, dims, _, value in shaped:  # bind the plain names first
        if torch.is_tensor(value) and value.dim() == len(dims):
            for dim, size in zip(dims, value.shape):
                if dim.isidentifier():
                    symbols.setdefault(dim, size)
    with torch.no_grad():
        result = function(**kwargs)
    if len(outputs) > 1 and not (isinstance(result, tuple) and len(result) == len(outputs)):
        return problems + [f"states {len(outputs)} outputs, the code returns {type(result)}"]
    values = result if len(outputs) > 1 else (result,)
    checks = shaped + [(name, dims, dtype, value) for (name, dims, dtype), value
                       in zip(outputs, values) if dims is not None]
    for name, dims, dtype, value in checks:
        if not torch.is_tensor(value):
            problems.append(f"{name}: a shape is stated, but the code has {type(value)}")
            continue
        try:
            expected = tuple(eval(dim, {"__builtins__": {}}, symbols) for dim in dims)
        except NameError as e:
            problems.append(f"{name}: {e} (bind it in the example)")
            continue
        if tuple(value.shape) != expected:
            problems.append(f"{name}: stated ({', '.join(dims)}) = {expected}, the code gives "
                            f"{tuple(value.shape)}")
        if dtype is not None and not DTYPES[dtype](value):
            problems.append(f"{name}: stated {dtype}, the code gives {value.dtype}")
    return problems


def writeup_problems(a, text):
    """What a write-up says that the code does not do: the title's points, the set of functions
    in its signature block, each one's signature and its shapes."""
    problems = []
    title = TITLE.match(text)
    if title is None or title.groups() != (str(a["number"]), str(a["points"])):
        problems.append(f"the title line should be '# Assignment {a['number']}: ... "
                        f"({a['points']} points)'")
    try:
        stated = stated_functions(text)
    except (SyntaxError, ValueError) as e:
        return problems + [f"signature block: {e}"]
    if set(stated) != set(a["functions"]):
        problems.append(f"the signature block holds {sorted(stated)}, the assignment blanks "
                        f"{sorted(a['functions'])}")
    for name, (stub, doc) in stated.items():
        if name not in a["functions"]:
            continue
        function = code_function(name)
        if inspect.signature(stub) != inspect.signature(function):
            problems.append(f"{name}: the write-up says {inspect.signature(stub)}, the code has "
                            f"{inspect.signature(function)}")
        try:
            example = shape_example(name)
            problems += [f"{name}: {p}" for p in shape_problems(function, doc, *example)]
        except ValueError as e:
            problems.append(f"{name}: {e}")
    return problems


def count_problems(a, text, collected):
    """'N tests (M cases)' in the write-up against the tests listed and the cases pytest collects
    for them (grade.py counts the same)."""
    cases = sum(len(grader.cases_of(test, collected)) for test in a["tests"])
    stated = set(COUNTS.findall(text))
    if stated != {(str(len(a["tests"])), str(cases))}:
        return [f"{a['writeup']} says {sorted(stated)} as (tests, cases); the grader runs "
                f"{len(a['tests'])} tests ({cases} cases)"]
    return []


def size_problems(a, text, measured):
    """'about N lines of code to write; M lines of given helpers to call' against handout.py's
    measure, within 20% (or 3 lines): a small refactor passes, a changed assignment does not."""
    student, helpers = measured
    stated = SIZE.findall(text)
    if len(stated) != 1:
        return [f"{a['writeup']} should say once 'about N lines of code to write; M lines of given "
                "helpers to call'"]
    problems = []
    for what, said, actual in zip(("to write", "of helpers"), map(int, stated[0]),
                                  (student, helpers)):
        if abs(said - actual) > max(3, 0.2 * actual):
            problems.append(f"{a['writeup']}: says {said} lines {what}, measured {actual} "
                            "(python assignments/handout.py --measure)")
    return problems


@pytest.fixture(scope="module")
def collected():
    """The node ids pytest collects for every listed test, in one collection."""
    return grader.collect([t for a in course.ASSIGNMENTS for t in a["tests"]])


@pytest.fixture(scope="module")
def measured():
    return {n: (student, sum(helpers.values()))
            for n, student, helpers in handout.measure(IMPLEMENTED)}


@pytest.mark.parametrize("n", IMPLEMENTED)
def test_writeup_states_the_code(n, collected, measured):
    a = BY_NUMBER[n]
    text = writeup(a)
    problems = writeup_problems(a, text) + count_problems(a, text, collected)
    assert problems + size_problems(a, text, measured[n]) == []


def test_the_writeup_checks_can_fail(collected, measured):
    """Each check finds a write-up that says something else than the code: the write-up of
    assignment 2 as it is passes, and each change below is found."""
    a = BY_NUMBER[2]
    text = writeup(a)
    assert writeup_problems(a, text) == count_problems(a, text, collected) == []
    changes = {  # what a stale write-up said (issue 28)
        "noisy_start left out": ("noisy_start=None):", "):"),
        "the noisy half as 2L": ("idx (B, T) long", "idx (B, 2 * L) long"),
        "a dtype": ("is_masked (B, L) bool", "is_masked (B, L) long"),
        "an input that is no parameter": ("maskable (B, L) bool ->", "noise (B, L) bool ->"),
        "a function left out": ("def add_noise(", "def add_noise_old("),
        "the points": ("(10 points)", "(15 points)"),
    }
    for what, (old, new) in changes.items():
        assert old in text, what
        assert writeup_problems(a, text.replace(old, new, 1)) != [], what
    stated = COUNTS.search(text).group(0)
    tests, cases = COUNTS.search(text).groups()
    more = text.replace(stated, f"{tests} tests ({int(cases) + 1} cases)")
    assert count_problems(a, more, collected) != []
    size = SIZE.search(text)
    bigger = text.replace(size.group(0), size.group(0).replace(size.group(1), "60", 1))
    assert size_problems(a, text, measured[2]) == [] and size_problems(a, bigger, measured[2])


def shape_example(name):
    """Keyword arguments of one small call of name, and the sizes its arguments do not fix."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 5, 7, generator=g), dim=-1)  # (B, k, V)
    is_masked = torch.rand(2, 5, generator=g) < 0.6
    x = torch.randint(0, 50, (3, 10), generator=g)
    answer = (torch.arange(10) >= 5).expand(3, 10)
    gpt = random_model("gpt-tiny")
    prompt = torch.randint(0, 63, (2, 5), generator=g)
    settings = sampling.DecodeSettings(mask_id=63, k=5, gamma=1.0)

    def cache_after_prompt():
        cache = gpt.new_cache(2, 20, "cpu")
        gpt(prompt[:, :-1], cache=cache)  # 4 committed
        return cache

    llama_config = model_lib.LlamaConfig(**model_lib.LLAMA_PRESETS["llama-tiny"])
    llama = random_model("llama-tiny")
    cos, sin = model_lib.rotary_cos_sin(torch.arange(6), llama.inv_freq)
    kv_cache = model_lib.KVCache(2, 2, 3, 4, max_len=16, device="cpu", dtype=torch.float32)
    kv_cache.length = 5
    phases = torch.tensor([0, 1, 2])
    return {
        "model.py:causal_mask": lambda: (
            dict(q=torch.arange(3, 7)[:, None], k=torch.arange(7)[None, :]), {}),
        "sbd.py:block_id": lambda: (dict(i=torch.arange(-3, 9), k=4, phase=1), {}),
        "sbd.py:hybrid_mask": lambda: (
            dict(q=torch.arange(3, 7)[:, None], kv=torch.arange(7)[None, :], block_start=5), {}),
        "sbd.py:sbd_training_mask": lambda: (
            dict(q=torch.arange(8)[None, :, None], kv=torch.arange(8)[None, None, :], L=6, k=4,
                 phase=phases[:, None, None], noisy_start=4), {}),
        "sbd.py:add_noise": lambda: (dict(x=x, mask_id=99, maskable=answer, generator=g), {}),
        "sbd.py:sbd_inputs": lambda: (
            dict(x=x, y=x, mask_id=99, k=4, phases=phases, maskable=answer, generator=g),
            dict(T=2 * 10 - sbd.first_noisy_position(answer, 4, phases))),
        "sbd.py:sbd_loss": lambda: (
            dict(logits=torch.randn(2, 9, 7), labels=torch.randint(0, 7, (2, 9)), L=6), {}),
        "model.py:KVCache.extend": lambda: (
            dict(self=kv_cache, layer=1, k_new=torch.randn(2, 3, 6, 4),
                 v_new=torch.randn(2, 3, 6, 4), n_commit=2), dict(L=kv_cache.length)),
        "sampling.py:entropy": lambda: (dict(probs=probs), {}),
        "sampling.py:entropy_bound": lambda: (
            dict(h_sorted=torch.rand(2, 5), masked_sorted=is_masked, gamma=0.5), {}),
        "sampling.py:reveal_entropy": lambda: (dict(probs=probs, is_masked=is_masked, gamma=0.5),
                                               {}),
        "sampling.py:reveal_confidence": lambda: (
            dict(probs=probs, is_masked=is_masked, gamma=0.5), {}),
        "sampling.py:reveal_left": lambda: (dict(probs=probs, is_masked=is_masked, gamma=0.5), {}),
        "sampling.py:reveal_factor": lambda: (dict(probs=probs, is_masked=is_masked, f=1.0), {}),
        "generate.py:hybrid_forward": lambda: (
            dict(model=gpt, cache=cache_after_prompt(),
                 tokens=torch.cat([prompt[:, -1:], torch.full((2, 5), 63)], dim=1), n_commit=1),
            dict(V=gpt.config.vocab_size)),
        "generate.py:block_forward": lambda: (
            dict(model=gpt, cache=cache_after_prompt(), prev=prompt[:, -1:],
                 block=torch.full((2, 5), 63)), dict(V=gpt.config.vocab_size)),
        "generate.py:decode_block": lambda: (
            dict(model=gpt, cache=cache_after_prompt(), prev=prompt[:, -1:], kb=5,
                 active=torch.ones(2, dtype=torch.bool), settings=settings,
                 stop=torch.tensor([0])), {}),
        "generate.py:sbd_generate": lambda: (
            dict(model=gpt, prompt=prompt, settings=settings, max_new_tokens=8), {}),
        "model.py:rope_frequencies": lambda: (dict(config=llama_config),
                                              dict(head_dim=llama_config.head_dim)),
        "model.py:apply_rotary": lambda: (
            dict(x=torch.randn(2, 3, 6, llama_config.head_dim), cos=cos, sin=sin), {}),
        "model.py:LlamaAttention.forward": lambda: (
            dict(self=llama.layers[0].attention, x=torch.randn(2, 6, llama_config.dim), cos=cos,
                 sin=sin, layer=0, mask=None, cache=None, n_commit=6),
            dict(head_dim=llama_config.head_dim)),
        "pretrained/load_llama.py:hf_permute": lambda: (dict(w=torch.randn(16, 12), n_heads=2),
                                             dict(head_dim=8)),
        "pretrained/load_llama.py:hf_unpermute": lambda: (dict(w=torch.randn(16, 12), n_heads=2),
                                               dict(head_dim=8)),
    }[name]()

