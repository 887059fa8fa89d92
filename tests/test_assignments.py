"""
The course assignments (assignments/): handouts made by handout.py and graded by grade.py, checked as course
staff need them to be. Handouts are made once per module into a temporary directory:

- a stub never passes: on a handout where only assignment n is blanked, every test of n fails, and fails
  with the NotImplementedError naming assignment n (not with an import error or a renamed test);
- no assignment needs a later one, and the reference gets full points: n's tests pass, in under 20 s, on a
  handout where only the assignments after n are blanked (the code they run is the reference's);
- no solution leaks: no line of a blanked body (20 characters or more once whitespace is removed, with or
  without its comment) appears in a handout more often than the code the handout keeps has it anyway (a line
  such as a call of a given helper may also stand in a given function); the bodies are found here with ast,
  independently of handout.py;
- a handout imports cleanly: its modules import (train.py and sample.py are scripts that run on import, so
  every .py file is compiled instead), its tests collect, and the main command (train.py, tiny settings, with
  the report on 2 problems so that decoding runs too) either runs through or fails with the NotImplementedError
  of an assignment the handout blanks;
- the list is consistent: write-ups exist and name their functions, SPECS only fills missing docstrings.
Every subprocess runs with OMP_NUM_THREADS=1.
"""

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("course_list", os.path.join(ROOT, "assignments", "assignments.py"))
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)
IMPLEMENTED = [a["number"] for a in course.ASSIGNMENTS if a["kind"] == "implementation"]
BY_NUMBER = {a["number"]: a for a in course.ASSIGNMENTS}
ON_MAIN_PATH = {1, 2, 3, 4, 5}  # what train.py config/sbd_small.py runs (the GPT demo never builds a Llama: not 6)
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, cwd, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def make_handout(dest, numbers):
    """-> (directory, blanked assignment numbers, the files handout.py wrote, relative to the directory)."""
    done = run([os.path.join(ROOT, "assignments", "handout.py"), str(dest),
                "--assignments", ",".join(map(str, numbers))], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    files = [os.path.relpath(os.path.join(folder, f), dest) for folder, _, names in os.walk(dest) for f in names]
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


def grade(root, numbers, tmp_path):
    """Run root's grade.py -> (Gradescope results dict, printed table)."""
    results = tmp_path / f"results_{'_'.join(map(str, numbers))}.json"
    done = run([os.path.join(root, "assignments", "grade.py"), "--assignments", ",".join(map(str, numbers)),
                "--json", str(results)], cwd=tmp_path, timeout=600)  # from another directory: it finds its root
    assert results.exists(), done.stdout + done.stderr
    return json.loads(results.read_text()), done.stdout

# -----------------------------------------------------------------------------
# grading


@pytest.mark.parametrize("n", IMPLEMENTED)
def test_a_stub_never_passes(n, handouts, tmp_path):
    results, table = grade(handouts[f"only {n}"][0], [n], tmp_path)
    assert results["score"] == 0, table
    for t in results["tests"]:
        assert "NotImplementedError" in t["output"] and f"assignment {n}: " in t["output"], t


@pytest.mark.parametrize("n", IMPLEMENTED)
def test_full_points_without_any_later_assignment(n, handouts, tmp_path):
    """n's tests pass, in under 20 s, on a handout where every assignment after n is blanked: so they need
    nothing later, and they pass on the reference (the code they run is the reference's). After the last
    assignment nothing is blanked: its handout is the repository itself."""
    root = handouts[f"after {n}"][0] if n != IMPLEMENTED[-1] else ROOT
    results, table = grade(root, [n], tmp_path)
    assert results["score"] == BY_NUMBER[n]["points"], table
    assert all(t["score"] == t["max_score"] for t in results["tests"]), table
    assert len(results["tests"]) == len(BY_NUMBER[n]["tests"])
    assert results["extra_data"]["seconds"][str(n)] < 20, table

# -----------------------------------------------------------------------------
# what a handout holds


def squeeze(line):
    return "".join(line.split())  # whitespace removed: reformatting a line does not hide it


def pieces(line):
    """What the leak check looks for: the line and its code without the comment, whitespace removed."""
    return {p for p in (squeeze(line), squeeze(line.split("  #")[0])) if len(p) >= 20}


def body_of(text, qualname):
    """(first, end): 0-based line range of a function's body after its docstring, found with ast."""
    node = ast.parse(text)
    for part in qualname.split("."):
        node = next(n for n in node.body if getattr(n, "name", None) == part)
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body[0].lineno - 1, node.end_lineno


def leaks(directory, numbers, files):
    """Lines of the bodies blanked for `numbers` that `files` (in directory) hold more often than the code a
    handout keeps (the reference files without those bodies)."""
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
        kept.update(p for i, line in enumerate(lines) if not any(first <= i < end for first, end in spans)
                    for p in pieces(line))
    return [f"{path}: {line.strip()}" for path, line in bodies if any(in_handout[p] > kept[p] for p in pieces(line))]


def test_no_solution_leaks(handouts, tmp_path):
    for name, (directory, numbers, files) in handouts.items():
        assert leaks(directory, numbers, files) == [], f"handout {name!r}"
    reference = open(os.path.join(ROOT, "sampling.py")).read()
    (tmp_path / "sampling.py").write_text(reference)  # the check can fail: the file as it is,
    assert len(leaks(tmp_path, [4], ["sampling.py"])) >= 5  # 'handed out' with assignment 4


def test_handout_imports_collects_and_keeps_the_rest(handouts):
    directory = handouts["all"][0]
    for folder, _, files in os.walk(directory):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path) as fh:
                    compile(fh.read(), path, "exec")  # scripts included (train.py, sample.py run on import)
    done = run(["-c", "import model, sbd, load_llama, task, tokenizer, configurator, evaluate"], cwd=directory)
    assert done.returncode == 0, done.stderr
    done = run(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"], cwd=directory)
    assert done.returncode == 0, done.stdout[-3000:]
    for f in ("train.py", "README.md", "tests/test_model.py", "assignments/grade.py"):  # unblanked files: as they are
        with open(os.path.join(ROOT, f)) as a, open(os.path.join(directory, f)) as b:
            assert a.read() == b.read(), f
    assert not os.path.exists(os.path.join(directory, ".git")) and not os.path.exists(os.path.join(directory, ".venv"))
    assert not any(os.path.exists(os.path.join(directory, f)) for f in course.STAFF_ONLY)


@pytest.fixture(scope="module")
def addition_data(handouts):
    """train.py makes data/addition on first use (~3 s); the handouts share one copy, made here once."""
    directory = handouts["all"][0]
    done = run(["data/addition/prepare.py"], cwd=directory)
    assert done.returncode == 0, done.stderr
    return os.path.join(directory, "data", "addition")


@pytest.mark.parametrize("name", ["all"] + [f"only {n}" for n in IMPLEMENTED])
def test_main_command_fails_only_with_the_assignment(name, handouts, addition_data, tmp_path):
    directory, numbers, _ = handouts[name]
    for f in os.listdir(addition_data):
        if not os.path.exists(os.path.join(directory, "data", "addition", f)):
            shutil.copy(os.path.join(addition_data, f), os.path.join(directory, "data", "addition", f))
    done = run(["train.py", "config/sbd_small.py", f"--out_dir={tmp_path}", "--ntp_iters=2", "--sbd_iters=2",
                "--n_layer=1", "--n_head=2", "--n_embd=32", "--batch_size=8", "--sbd_batch_size=8",
                "--eval_interval=100", "--report_problems=2"], cwd=directory)
    if not set(numbers) & ON_MAIN_PATH:
        assert done.returncode == 0, done.stderr[-3000:]
        return
    last = done.stderr.strip().splitlines()[-1]
    found = re.fullmatch(r"NotImplementedError: assignment (\d+): \S+", last)
    assert done.returncode != 0 and found and int(found.group(1)) in numbers, done.stderr[-3000:]

# -----------------------------------------------------------------------------
# the list itself


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
        with open(os.path.join(ROOT, "assignments", a["writeup"])) as f:
            writeup = f.read()
        for name in a["functions"]:
            assert name in writeup, f"{a['writeup']} does not mention {name}"
        assert bool(a["tests"]) == (a["kind"] == "implementation")
