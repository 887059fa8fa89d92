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
  files (tests/test_assignment_leaks.py, which also shows that the check finds a planted renamed
  copy of every body it can see); the graded questions are checked in
  tests/test_assignment_questions.py;
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
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import torch

import model as model_lib
import sampling
from pretrained import shapes
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
GRADED = [a["number"] for a in course.ASSIGNMENTS if a["tests"]]  # graded by grade.py
BLANKS = [a["number"] for a in course.ASSIGNMENTS if a["functions"]]  # a handout blanks these
BY_NUMBER = {a["number"]: a for a in course.ASSIGNMENTS}
ON_MAIN_PATH = {1, 2, 3, 4, 5}  # what train.py config/sbd_small.py runs (never a Llama: not 6)
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, cwd, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def make_handout(dest, numbers, hidden=True):
    """-> (directory, blanked assignment numbers, the files handout.py wrote, relative to the
    directory). hidden: the autograder's copy, with the hidden tests (the grading checks run
    there); a student's copy has none."""
    done = run([os.path.join(ROOT, "assignments", "handout.py"), str(dest),
                "--assignments", ",".join(map(str, numbers))] + (["--hidden"] if hidden else []),
               cwd=ROOT)
    assert done.returncode == 0, done.stderr
    files = [os.path.relpath(os.path.join(folder, f), dest)
             for folder, _, names in os.walk(dest) for f in names]
    return dest, numbers, files


@pytest.fixture(scope="module")
def handouts(tmp_path_factory):
    """{name: make_handout(...)} for 'only n', 'after n' (when something after n is blanked),
    'all', and 'student' (all blanked, no hidden tests: what a student gets)."""
    base = tmp_path_factory.mktemp("handouts")
    made = {f"only {n}": make_handout(base / f"only_{n}", [n]) for n in GRADED}
    for n in GRADED:
        later = [m for m in BLANKS if m > n]
        if later:
            made[f"after {n}"] = make_handout(base / f"after_{n}", later)
    made["all"] = make_handout(base / "all", BLANKS)
    made["student"] = make_handout(base / "student", BLANKS, hidden=False)
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


@pytest.mark.slow
@pytest.mark.parametrize("n", GRADED)
def test_a_stub_never_passes(n, handouts, tmp_path):
    """A stub scores 0: every test fails with the assignment's NotImplementedError (an experiment
    without code to write: its numbers are not answered), and the handout's blank answers.toml
    earns no question's points."""
    results, table = grade(handouts[f"only {n}"][0], [n], tmp_path)
    assert results["score"] == 0, table
    questions = [t for t in results["tests"] if is_question(t)]
    assert len(questions) == len(course.QUESTIONS.get(n, [])), table
    assert len(questions) >= 2 or BY_NUMBER[n]["kind"] != "implementation", table
    assert all(t["output"].startswith("not answered") for t in questions), table
    for t in results["tests"]:
        if is_question(t):
            continue
        if BY_NUMBER[n]["functions"]:
            assert "NotImplementedError" in t["output"] and f"assignment {n}: " in t["output"], t
        else:
            assert "not answered" in t["output"], t


@pytest.mark.slow
@pytest.mark.parametrize("n", GRADED)
def test_full_points_without_any_later_assignment(n, handouts, tmp_path):
    """n's tests pass on a handout where every assignment after n is blanked: so they need nothing
    later, and they pass on the reference (the code they run is the reference's). When nothing
    after n is blanked, its handout is the repository itself. (How long each takes is the grader's
    seconds column, not a test: a loaded machine would fail a time limit.)"""
    root = handouts[f"after {n}"][0] if f"after {n}" in handouts else ROOT
    results, table = grade(root, [n], tmp_path, answers=REFERENCE_ANSWERS)
    assert results["score"] == BY_NUMBER[n]["points"], table
    assert all(t["score"] == t["max_score"] for t in results["tests"]), table
    assert len(results["tests"]) == len(BY_NUMBER[n]["tests"]) + len(course.QUESTIONS.get(n, []))

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


@pytest.mark.slow
def test_no_solution_leaks(handouts, tmp_path):
    for name, (directory, numbers, files) in handouts.items():
        assert leaks(directory, numbers, files) == [], f"handout {name!r}"
    reference = open(os.path.join(ROOT, "sampling.py")).read()
    (tmp_path / "sampling.py").write_text(reference)  # the check can fail: the file as it is,
    assert len(leaks(tmp_path, [4], ["sampling.py"])) >= 5  # 'handed out' with assignment 4


@pytest.mark.slow
def test_no_structural_copy_of_a_solution(handouts):
    """No renamed or reformatted copy of a blanked body, tests included, and in a student's
    handout none of a hidden reference either (tests/test_assignment_leaks.py)."""
    from test_assignment_leaks import hidden_references, structural_leaks  # imports this module

    for name, (directory, numbers, files) in handouts.items():
        references = hidden_references() if name == "student" else ()
        assert structural_leaks(directory, numbers, files, references) == [], f"handout {name!r}"


@pytest.mark.slow
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
    for f in ("train.py", "docs/llama.md", "tests/test_model.py", "assignments/grade.py"):
        with open(os.path.join(ROOT, f)) as a, open(os.path.join(directory, f)) as b:
            assert a.read() == b.read(), f
    assert not os.path.exists(os.path.join(directory, ".git"))
    assert not os.path.exists(os.path.join(directory, ".venv"))
    assert not any(os.path.exists(os.path.join(directory, f)) for f in course.STAFF_ONLY)


# what the repository says of token shift's rule, in words a student's handout must not hold while
# it blanks assignment 13 (handout.py withholds the sections that said it; kept here, staff only)
GIVEAWAYS = ["slot j - 1", "slot j-1", "int(token_shift)", "i + 1 of its block", "learns x_{i+1}",
             "slot i with x_{i+1}", "position j + 1", "token i + 1", "from block slot j",
             "predicts the next token of", "the next one)"]


def test_a_students_handout_holds_no_hidden_test_and_no_design_answer(handouts, tmp_path):
    """A student's handout has no tests/hidden/ and no STAFF_ONLY file; the sections a design
    assignment withholds say so in one line, and no file states the design's answer in words;
    grade.py marks the hidden tests it cannot run as hidden."""
    directory, _, files = handouts["student"]
    assert not any(f.startswith(course.HIDDEN) for f in files)
    assert not any(os.path.exists(os.path.join(directory, f)) for f in course.STAFF_ONLY)
    texts = {}
    for f in files:
        if f.endswith((".py", ".md", ".toml", ".txt")):
            with open(os.path.join(directory, f), encoding="utf-8", errors="replace") as fh:
                texts[f] = " ".join(fh.read().split()).lower()
    for entry in BY_NUMBER[13]["withheld"]:
        path, heading = entry.split("#", 1)
        assert f"{heading.lower()} withheld in this handout: assignment 13" in texts[path], entry
    said = [(f, phrase) for f, text in texts.items() for phrase in GIVEAWAYS if phrase in text]
    assert said == [], "a student's handout states token shift's rule"
    with open(os.path.join(ROOT, "README.md")) as fh:  # the check can fail: the repository says it
        readme = " ".join(fh.read().split()).lower()
    assert any(phrase in readme for phrase in GIVEAWAYS)
    results, table = grade(directory, [14], tmp_path)
    hidden = [t for t in results["tests"] if t["name"].endswith("(hidden)")]
    assert len(hidden) == 1 and hidden[0]["output"].startswith("hidden"), table
    assert "hidden: tests this copy does not have" in table, table


@pytest.mark.slow
def test_the_papers_rule_fails_the_design_with_messages_that_teach(handouts, tmp_path):
    """Assignment 13 answered with the paper's rule (a slot predicts its own position): no leak,
    training and decoding agree, the cache is exact; the short run and the next-token drafter
    fail, each saying in words what went wrong."""
    directory = tmp_path / "paper"
    shutil.copytree(handouts["only 13"][0], directory)
    path = directory / "sbd.py"
    text = path.read_text()
    for name, body in (("sbd.py:shift_read_at", "return j"),
                       ("sbd.py:shift_labels", "return torch.where(is_masked, x, IGNORE_INDEX)")):
        stub = f'raise NotImplementedError("assignment 13: {name}")'
        assert text.count(stub) == 1
        text = text.replace(stub, body)
    path.write_text(text)
    results, table = grade(directory, [13], tmp_path)
    # the message: the first line of each failure's output (the traceback follows it)
    failed = {t["name"].split("::")[1].split(" ")[0]: t["output"].splitlines()[0]
              for t in results["tests"] if t["score"] < t["max_score"]}
    assert sorted(failed) == ["test_a_next_token_drafter_drafts_every_token_right",
                              "test_a_short_run_from_an_ntp_model_learns_fast"], table
    assert "which token does a slot of the pretrained model predict" in (
        failed["test_a_short_run_from_an_ntp_model_learns_fast"]), table
    assert "decoding reads block positions at slots that do not predict them" in (
        failed["test_a_next_token_drafter_drafts_every_token_right"]), table
    assert "tensor(" not in "".join(failed.values()), "a message in words, not a tensor diff"


@pytest.fixture(scope="module")
def addition_data(handouts):
    """train.py makes data/addition on first use (~3 s); the handouts share one copy, made here
    once."""
    directory = handouts["all"][0]
    done = run(["data/addition/prepare.py"], cwd=directory)
    assert done.returncode == 0, done.stderr
    return os.path.join(directory, "data", "addition")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["all"] + [f"only {n}" for n in BLANKS])
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
# the list itself


def writeup(a):
    with open(os.path.join(ROOT, "assignments", a["writeup"]), encoding="utf-8") as f:
        return f.read()


def test_the_list_is_consistent():
    assert [a["number"] for a in course.ASSIGNMENTS] == list(range(1, len(course.ASSIGNMENTS) + 1))
    assert len(IMPLEMENTED) >= 6 and len(course.ASSIGNMENTS) - len(GRADED) >= 3
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
        graded = a["kind"] in ("implementation", "design", "measurement")
        assert bool(a["tests"]) == graded, a["number"]
        assert (a["number"] in course.QUESTIONS) == (a["kind"] == "implementation"), a["number"]
        assert not a.get("withheld") or a["kind"] == "design", a["number"]

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
    if path.startswith("assignments/"):  # not a package: its modules import each other by name
        found = load(f"course_{os.path.basename(path)[:-3]}", os.path.basename(path))
    else:
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
    if not a["functions"]:  # an experiment without code to write: no signature block
        return problems
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
            for n, student, helpers in handout.measure(BLANKS)}


@pytest.mark.parametrize("n", GRADED)
def test_writeup_states_the_code(n, collected, measured):
    a = BY_NUMBER[n]
    text = writeup(a)
    problems = writeup_problems(a, text) + count_problems(a, text, collected)
    if a["functions"]:
        problems += size_problems(a, text, measured[n])
    assert problems == []


def test_the_writeup_checks_can_fail(collected, measured):
    """Each check finds a write-up that says something else than the code: the write-up of
    assignment 2 as it is passes, and each change below is found."""
    a = BY_NUMBER[2]
    text = writeup(a)
    assert writeup_problems(a, text) == count_problems(a, text, collected) == []
    changes = {  # what a stale write-up once said
        "token_shift left out": ("token_shift=False, make_mask=None):", "make_mask=None):"),
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

    llama_config = model_lib.LlamaConfig(**shapes.LLAMA_PRESETS["llama-tiny"])
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
        "sbd.py:noisy_labels": lambda: (
            dict(x=x, is_masked=answer & (x % 2 == 0), k=4, phases=phases), {}),
        "sbd.py:sbd_layout": lambda: (
            dict(x=x, y=x, mask_id=99, masks=[answer & (x % 2 == 0)], k=4, phases=phases,
                 noisy_start=4), dict(T=2 * 10 - 4)),
        "sbd.py:shift_read_at": lambda: (dict(j=torch.arange(6)), {}),
        "sbd.py:shift_labels": lambda: (
            dict(x=x, is_masked=answer & (x % 2 == 0), k=4, phases=phases), {}),
        "assignments/experiments.py:leaky_training_mask": lambda: (
            dict(q=torch.arange(8)[None, :, None], kv=torch.arange(8)[None, None, :], L=6, k=4,
                 phase=phases[:, None, None], noisy_start=4), {}),
        "sbd.py:sbd_loss": lambda: (
            dict(logits=torch.randn(2, 9, 7), labels=torch.randint(0, 7, (2, 9)), L=6), {}),
        "model.py:KVCache.extend": lambda: (
            dict(self=kv_cache, layer=1, k_new=torch.randn(2, 3, 6, 4),
                 v_new=torch.randn(2, 3, 6, 4), n_commit=2), dict(S=kv_cache.max_len)),
        "sampling.py:entropy": lambda: (dict(probs=probs), {}),
        "sampling.py:entropy_bound": lambda: (
            dict(h_sorted=torch.rand(2, 5), masked_sorted=is_masked, gamma=0.5), {}),
        "sampling.py:reveal_entropy": lambda: (dict(probs=probs, is_masked=is_masked, gamma=0.5),
                                               {}),
        "sampling.py:reveal_confidence": lambda: (
            dict(probs=probs, is_masked=is_masked, gamma=0.5), {}),
        "sampling.py:reveal_left": lambda: (dict(probs=probs, is_masked=is_masked, gamma=0.5), {}),
        "sampling.py:reveal_factor": lambda: (dict(probs=probs, is_masked=is_masked, f=1.0), {}),
        "decode.py:hybrid_forward": lambda: (
            dict(model=gpt, cache=cache_after_prompt(),
                 tokens=torch.cat([prompt[:, -1:], torch.full((2, 5), 63)], dim=1), n_commit=1),
            dict(V=gpt.config.vocab_size)),
        "decode.py:fill": lambda: (
            dict(model=gpt, cache=gpt.new_cache(1, 20, "cpu"), block=torch.full((1, 5), 63),
                 logits=torch.randn(1, 5, 64, generator=g),
                 settings=settings.replace(temperature=1.0), generator=g, widths=[]), {}),
        "decode.py:sbd": lambda: (
            dict(model=gpt, prompt=prompt[:1], settings=settings, max_new_tokens=8), {}),
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

