"""
Grade the assignments: run each one's tests (assignments.py), check the answers to its graded
questions, and print a points table. Implementation assignments and the graded experiments
(kind "measurement": their tests run the experiment again and compare the numbers in answers.toml)
are graded here; the other experiments by hand.

    python assignments/grade.py                      # in a handout: its assignments; else all
    python assignments/grade.py --assignments 4      # only assignment 4
    python assignments/grade.py --json results.json  # also write Gradescope's results.json
    python assignments/grade.py --answers my.toml    # answers from another file

Works from any directory, in the repository or in a handout: it runs one pytest process per
assignment in the repository root, found next to this file, at one thread unless OMP_NUM_THREADS
says otherwise. A question earns its points when the answer in answers.toml (next to this file,
or --answers) is right; the rest of an assignment's points are split equally over its listed
tests, and a listed test with several parametrized cases earns its share in proportion to the cases
it passes (a skipped case counts as not passed). List module-level test functions: a test inside a
class is not found. A listed test in tests/hidden/ that this copy does not have (a student's
handout leaves the hidden tests out) is not run: it earns nothing here and is marked hidden, and
the autograder, whose copy has them, runs it. The JSON has one entry per listed test and one per
question: {"score", "tests": [{"name", "score", "max_score", "output"}]}, plus "execution_time"
and each assignment's seconds in "extra_data".

Answers are checked against a salted, slow hash of their canonical form (digest below), so this
file and assignments.py do not hold them; an answer with few possible values can still be found by
trying them, so teachers who care limit the submissions.
Exit status 0 when every graded test that ran passed and every question is answered right, 1
otherwise.
"""

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET

import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from assignments import ASSIGNMENTS, QUESTIONS  # noqa: E402  (the list next to this file)

ANSWERS = os.path.join(HERE, "answers.toml")
ITERATIONS = 100_000  # pbkdf2 rounds: ~0.05 s per check, slow enough to make guessing cost


def cases_of(test, node_ids):
    """The node ids among node_ids that a listed test stands for: itself, or all its parametrized
    cases when it names a whole test function ("tests/test_x.py::test_y" -> "...::test_y[...]")."""
    return [n for n in node_ids if n == test or ("[" not in test and n.startswith(test + "["))]


def collect(tests, timeout=300):
    """-> the node ids pytest collects for the listed tests (in ROOT), without running them: the
    cases grade() counts. A listed test that does not exist is a RuntimeError."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p",
           "no:cacheprovider", *tests]  # one -q whatever pytest.ini adds: one node id per line
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # a listed test that does not exist fails the whole collection
        raise RuntimeError(f"pytest could not collect the listed tests:\n{done.stdout[-3000:]}"
                           f"{done.stderr[-3000:]}")
    lines = (line.strip() for line in done.stdout.splitlines())
    return [line for line in lines if "::" in line and " " not in line]


def is_hidden(test):
    """A listed test of a file this copy does not have: a hidden test in a student's handout."""
    return not os.path.exists(os.path.join(ROOT, test.split("::")[0]))


def run_tests(tests, timeout, answers=ANSWERS):
    """Run pytest on the node ids in ROOT -> (cases {node id: failure text or None}, pytest's
    output, seconds). The graded experiments' tests read the answers from SBD_ANSWERS."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
               f"--junitxml={report}", *tests]  # every listed test, slow ones included
        # the tests' models are tiny: more threads only add overhead, and on a busy machine they
        # wait for each other (a 2-s assignment took a minute at 2 threads on 2 shared cores)
        env = {"OMP_NUM_THREADS": "1", **os.environ, "SBD_ANSWERS": os.path.abspath(answers)}
        t0 = time.time()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            return {}, f"timed out after {timeout} s (an endless loop?)", time.time() - t0
        seconds = time.time() - t0
        cases = {}
        if os.path.exists(report):
            # classname 'tests.test_model', name 'test_x[params]'
            for case in ET.parse(report).iter("testcase"):
                node_id = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
                problems = [p for p in case if p.tag in ("failure", "error", "skipped")]
                cases[node_id] = "\n".join(f"{p.get('message') or p.tag}\n{p.text or ''}"
                                           for p in problems) if problems else None
    return cases, output, seconds


def canonical(kind, value):
    """An answer as the text its digest is taken of -> str, or None if it is no answer of that
    kind. kind "ints": a list of integers (or one integer) -> "3,-1,7"; "numbers:D": a list of
    numbers (or one) rounded to D decimals -> "0.14,-1.00"."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                             and math.isfinite(v) for v in values):
        return None
    if kind == "ints":
        if not all(float(v).is_integer() for v in values):
            return None
        return ",".join(str(int(v)) for v in values)
    decimals = int(kind.split(":")[1])
    return ",".join(f"{round(v, decimals) + 0.0:.{decimals}f}" for v in values)  # + 0.0: no -0


def digest(question, text):
    """The stored check of an answer: pbkdf2-sha256 of its canonical text, salted per question."""
    salt = f"{question['salt']}:{question['id']}".encode()
    return hashlib.pbkdf2_hmac("sha256", text.encode(), salt, ITERATIONS).hex()


def read_answers(path):
    """answers.toml -> {"1.1": value}: table [assignment_N], key qI for question N.I. A missing
    file is no answers."""
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        tables = tomllib.load(f)
    return {f"{table.split('_')[-1]}.{key[1:]}": value for table, keys in tables.items()
            if table.startswith("assignment_") and isinstance(keys, dict)
            for key, value in keys.items()}


def grade_questions(assignment, answers):
    """-> Gradescope entries, one per question of the assignment."""
    entries = []
    for q in QUESTIONS.get(assignment["number"], []):
        text = canonical(q["kind"], answers.get(q["id"], []))
        right = text is not None and digest(q, text) == q["digest"]
        output = ("right" if right else "not answered (or not a list of numbers)" if text is None
                  else f"wrong: read as {text}")
        entries.append(dict(name=f"{assignment['number']}. {assignment['title']}: question "
                                 f"{q['id']} ({assignment['writeup']})",
                            score=q["points"] if right else 0.0, max_score=q["points"],
                            output=output))
    return entries


def grade(assignment, timeout, answers=None, answers_path=ANSWERS):
    """-> dict(number, title, points, max_points, passed, failed, hidden, seconds, tests=[Gradescope
    test entries], failures=[(test, cases passed, cases, first error line)], questions=(right,
    of))."""
    hidden = [t for t in assignment["tests"] if is_hidden(t)]
    visible = [t for t in assignment["tests"] if t not in hidden]
    cases, output, seconds = (run_tests(visible, timeout, answers_path) if visible
                              else ({}, "", 0.0))
    questions = grade_questions(assignment, answers or {})
    test_points = assignment["points"] - sum(q["max_score"] for q in questions)
    share = test_points / len(assignment["tests"])
    entries, failures, passed, failed = [], [], 0, 0
    for test in assignment["tests"]:
        if test in hidden:
            entries.append(dict(name=f"{assignment['number']}. {assignment['title']}: {test} "
                                     "(hidden)", score=0.0, max_score=share,
                                output="hidden: not in this copy; the autograder runs it"))
            continue
        mine = {n: cases[n] for n in cases_of(test, cases)}
        ok = sum(f is None for f in mine.values())
        passed, failed = passed + ok, failed + len(mine) - ok
        if not mine:  # not run at all: a collection error, a renamed test, a timeout
            failed += 1
            text = f"not run; pytest said:\n{output[-3000:]}"
        else:
            text = "\n".join(f"{f[:2000]}\n({n})" for n, f in mine.items() if f is not None)
        if ok < len(mine) or not mine:
            failures.append((test, ok, len(mine), text.splitlines()[0]))
        name = f"{assignment['number']}. {assignment['title']}: {test} ({ok}/{len(mine)} passed)"
        score = share if mine and ok == len(mine) else share * ok / len(mine) if mine else 0.0
        entries.append(dict(name=name, score=score,
                            max_score=share, output=text or "passed"))
    for q in questions:
        if q["score"] < q["max_score"]:
            failures.append((q["name"].split(": ", 1)[1], 0, 1, q["output"]))
    entries += questions
    right = sum(q["score"] == q["max_score"] for q in questions)
    return dict(number=assignment["number"], title=assignment["title"],
                max_points=assignment["points"], points=sum(e["score"] for e in entries),
                passed=passed, failed=failed, hidden=len(hidden), seconds=seconds, tests=entries,
                failures=failures,
                questions=(right, len(questions)))


def print_table(results):
    print(f"{'assignment':46s} {'points':>11s} {'passed':>7s} {'failed':>7s} {'hidden':>7s} "
          f"{'questions':>9s} {'seconds':>8s}")
    for r in results:
        name = f"{r['number']}. {r['title']}"[:46]
        right, of = r["questions"]
        print(f"{name:46s} {r['points']:5.1f}/{r['max_points']:<5g} {r['passed']:7d} "
              f"{r['failed']:7d} {r['hidden']:7d} {f'{right}/{of}':>9s} {r['seconds']:8.1f}")
    total, most = sum(r["points"] for r in results), sum(r["max_points"] for r in results)
    print(f"{'total':46s} {total:5.1f}/{most:<5g}")
    if any(r["hidden"] for r in results):
        print("hidden: tests this copy does not have (tests/hidden/); the autograder runs them, "
              "and their points are not counted here (passed and failed count test cases, "
              "hidden counts tests)")
    for r in results:
        if r["failures"]:
            print(f"\nassignment {r['number']}, failed (cases passed / cases):")
        for test, ok, n, first_line in r["failures"]:
            print(f"  {f'{ok}/{n}':>6s}  {test}")
            # the whole first line: a graded test's assertion says in words what went wrong
            print(textwrap.fill(first_line[:1000], width=100, initial_indent=" " * 10,
                                subsequent_indent=" " * 10))


def default_selection():
    """The handout's assignments (handout.json, written by handout.py), or every graded one."""
    path = os.path.join(HERE, "handout.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["assignments"]
    return [a["number"] for a in ASSIGNMENTS if a["tests"]]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assignments", default=None,
                        help="comma-separated numbers, e.g. 4 or 1,2,3")
    parser.add_argument("--json", default=None,
                        help="write Gradescope's results.json format to this file")
    parser.add_argument("--answers", default=ANSWERS,
                        help="the answers to the graded questions (default: answers.toml next to "
                             "this file)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds allowed per assignment's tests")
    args = parser.parse_args()
    numbers = ([int(n) for n in args.assignments.split(",")] if args.assignments
               else default_selection())
    by_number = {a["number"]: a for a in ASSIGNMENTS}
    unknown = [n for n in numbers if n not in by_number]
    if unknown:
        raise SystemExit(f"error: no assignment {unknown}; there are {sorted(by_number)}")
    chosen = [by_number[n] for n in numbers if by_number[n]["tests"]]
    for n in numbers:
        if not by_number[n]["tests"]:
            print(f"assignment {n} is an experiment: written up and graded by hand "
                  f"({by_number[n]['writeup']})")
    answers = read_answers(args.answers)
    results = [grade(a, args.timeout, answers, args.answers) for a in chosen]
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(score=round(sum(r["points"] for r in results), 4),
                           execution_time=round(sum(r["seconds"] for r in results), 1),
                           tests=[t for r in results for t in r["tests"]],
                           extra_data=dict(seconds={r["number"]: round(r["seconds"], 1)
                                                    for r in results})),
                      f, indent=1)
    sys.exit(0 if all(r["failed"] == 0 and r["questions"][0] == r["questions"][1]
                      for r in results) else 1)
