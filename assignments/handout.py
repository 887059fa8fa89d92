"""
Write a student copy of this repository with some assignments' functions blanked.

    python assignments/handout.py ../sbd-handout                    # assignments 1-6 blanked
    python assignments/handout.py ../sbd-handout --assignments 1,4  # only these
    python assignments/handout.py ../autograder --hidden            # the grader's copy
    python assignments/handout.py --measure   # lines each assignment leaves to the student

The copy holds the repository's files (tracked, plus new files git does not ignore; no .git, no
virtual environment, no out*/ runs, no generated data, no STAFF_ONLY file). Each function that
assignments.py names for the chosen assignments keeps its signature and docstring (the
specification); the rest of its body becomes
    raise NotImplementedError("assignment N: file:name")
The function is found on the syntax tree (ast) and exactly the lines of its body after the docstring
are replaced: the source needs no solution markers. Two more things stay out of a student's copy:
the hidden tests (HIDDEN: reference implementations of blanked functions and the checks that use
them; --hidden keeps them, for the autograder's copy) and, for a design assignment, the Markdown
sections that describe its solution (an assignment's "withheld"), whose text becomes one line that
says so. Every other line of every file stays as it is. There is no solutions mode to generate: the
solutions are this repository.
"""

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from assignments import ASSIGNMENTS, HIDDEN, SPECS, STAFF_ONLY  # noqa: E402  (the list next to it)

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def find_function(tree, qualname):
    """The FunctionDef of 'f' or 'Class.f' at the top level of a module, or None."""
    node = tree
    for part in qualname.split("."):
        found = [n for n in getattr(node, "body", [])
                 if isinstance(n, DEFINITIONS) and n.name == part]
        if not found:
            return None
        node = found[-1]  # a later definition replaces an earlier one, as when Python runs the file
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def docstring_of(func):
    first = func.body[0]
    is_string = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return first if is_string and isinstance(first.value.value, str) else None


def body_lines(text, path, qualname):
    """-> (first, end, indent, has_docstring): the function's body after its docstring is
    lines[first:end] (0-based, end exclusive), including comment lines indented under it; indent =
    the body's indentation."""
    func = find_function(ast.parse(text, filename=path), qualname)
    if func is None:
        raise SystemExit(f"error: {path}:{qualname} does not exist (renamed? update "
                         "assignments/assignments.py)")
    doc = docstring_of(func)
    if doc is not None and len(func.body) == 1:
        raise SystemExit(f"error: {path}:{qualname} has nothing but a docstring to blank")
    start = func.body[1] if doc is not None else func.body[0]
    if start.lineno == func.lineno or (doc is not None and start.lineno == doc.end_lineno):
        raise SystemExit(f"error: {path}:{qualname} must have its body on lines of its own to be "
                         "blanked")
    lines = text.splitlines(keepends=True)

    def indented_comment(line):
        return line.lstrip().startswith("#") and len(line) - len(line.lstrip()) > func.col_offset

    if doc is not None:
        first = doc.end_lineno  # 0-based index of the line after the docstring
    else:  # and the comment lines between the signature and the first statement
        first = start.lineno - 1
        while first - 1 >= func.lineno and indented_comment(lines[first - 1]):
            first -= 1
    end = func.end_lineno
    for j in range(func.end_lineno, len(lines)):  # comments indented under it after its end
        if indented_comment(lines[j]):
            end = j + 1
        elif lines[j].strip():
            break
    return first, end, " " * start.col_offset, doc is not None


def spec_docstring(name, indent):
    """SPECS[name] as the lines of a docstring at the given indentation."""
    lines = SPECS[name].split("\n")
    doc = [f'{indent}"""{lines[0]}'] + [f"{indent}{line}" if line else "" for line in lines[1:]]
    doc[-1] += '"""'
    return [line + "\n" for line in doc]


def blank_file(text, path, targets):
    """text with each (number, qualname) of targets blanked -> new text."""
    spans = []
    for number, qualname in targets:
        first, end, indent, has_doc = body_lines(text, path, qualname)
        name = f"{path}:{qualname}"
        if has_doc and name in SPECS:
            raise SystemExit(f"error: {name} has a docstring now: remove its entry from SPECS in "
                             "assignments.py")
        if not has_doc and name not in SPECS:
            raise SystemExit(f"error: {name} has no docstring to serve as its specification: add "
                             "one to the source, or an entry to SPECS in assignments.py")
        new = spec_docstring(name, indent) if name in SPECS else []
        new.append(f'{indent}raise NotImplementedError("assignment {number}: {name}")\n')
        spans.append((first, end, new))
    lines = text.splitlines(keepends=True)
    # from the bottom up, so that earlier line numbers stay valid
    for first, end, new in sorted(spans, reverse=True):
        lines[first:end] = new
    blanked = "".join(lines)
    ast.parse(blanked, filename=path)  # still valid Python
    return blanked


def withhold_sections(text, path, headings, note):
    """text with the body of each Markdown section whose heading is in headings (up to the next
    heading of its level or above; lines in code blocks are no headings) replaced by the line
    note."""
    lines = text.splitlines(keepends=True)
    for heading in headings:
        fenced, level_of = False, {}
        for i, line in enumerate(lines):
            fenced ^= line.startswith("```")
            if not fenced and line.startswith("#"):
                level_of[i] = len(line) - len(line.lstrip("#"))
        found = [i for i in level_of if lines[i].lstrip("#").strip() == heading]
        if len(found) != 1:
            raise SystemExit(f"error: {path} has {len(found)} sections {heading!r} (renamed? "
                             "update 'withheld' in assignments/assignments.py)")
        start = found[0]
        end = next((i for i in sorted(level_of) if i > start and level_of[i] <= level_of[start]),
                   len(lines))
        lines[start + 1:end] = ["\n", note + "\n", "\n"]
    return "".join(lines)


def repository_files(root, hidden=False):
    """Files a handout copies: tracked, plus untracked ones .gitignore does not exclude, minus
    STAFF_ONLY and, unless hidden, the hidden tests."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=root,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"error: {root} is not a git checkout; make handouts from a clone of the "
                         "repository") from e
    files = sorted(set(f for f in listed.split("\0") if f))
    return [f for f in files if f not in STAFF_ONLY and (hidden or not f.startswith(HIDDEN))
            and os.path.isfile(os.path.join(root, f))]


def targets_by_file(numbers):
    """{file: [(assignment number, qualname), ...]} for the chosen assignments; a function named
    twice is an error."""
    by_file, seen = {}, {}
    for a in ASSIGNMENTS:
        if a["number"] in numbers:
            for name in a["functions"]:
                if name in seen:
                    raise SystemExit(f"error: {name} is in assignments {seen[name]} and "
                                     f"{a['number']}")
                seen[name] = a["number"]
                path, qualname = name.split(":")
                by_file.setdefault(path, []).append((a["number"], qualname))
    return by_file


def withheld_by_file(numbers):
    """{file: [(assignment, heading), ...]}: the Markdown sections that the chosen assignments
    withhold."""
    by_file = {}
    for a in ASSIGNMENTS:
        if a["number"] in numbers:
            for entry in a.get("withheld", []):
                path, heading = entry.split("#", 1)
                by_file.setdefault(path, []).append((a, heading))
    return by_file


def make_handout(dest, numbers, root=ROOT, hidden=False):
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and os.listdir(dest):
        raise SystemExit(f"error: {dest} exists and is not empty")
    if os.path.commonpath([dest, root]) == root:
        raise SystemExit("error: write the handout outside the repository (e.g. "
                         f"{os.path.dirname(root)}/handout)")
    by_file, withheld = targets_by_file(numbers), withheld_by_file(numbers)
    files = repository_files(root, hidden)
    missing = sorted(set(by_file) - set(files))
    if missing:
        raise SystemExit(f"error: assignments.py names functions in {missing}, which the "
                         "repository does not have")
    for f in files:
        src, dst = os.path.join(root, f), os.path.join(dest, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
        if f in by_file or f in withheld:
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
            if f in by_file:
                text = blank_file(text, f, by_file[f])
            for a, heading in withheld.get(f, []):
                text = withhold_sections(text, f, [heading],
                                         f"Withheld in this handout: assignment {a['number']} asks "
                                         f"you to design it (assignments/{a['writeup']}).")
            with open(dst, "w", encoding="utf-8") as fh:
                fh.write(text)
    # grade.py's default selection
    with open(os.path.join(dest, "assignments", "handout.json"), "w") as fh:
        json.dump({"assignments": sorted(numbers)}, fh)
    n_blanked = sum(len(t) for t in by_file.values())
    print(f"wrote {len(files)} files to {dest}: assignments {sorted(numbers)}, {n_blanked} "
          f"functions blanked, hidden tests {'kept' if hidden else 'left out'}")
    print(f"students: cd {dest} && python assignments/grade.py")


def code_lines(lines):
    """Lines that hold code: not blank, not only a comment."""
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def measure(numbers, root=ROOT):
    """How much of each chosen assignment the handout gives away -> [(number, lines the student
    writes, {helper: its lines})]: the code lines of the blanked bodies (the reference solution),
    and the functions of the repository that those bodies use by name and that no assignment
    blanks (given helpers: a function of the same file, or one imported from another file of the
    repository), with their code lines after the docstring."""
    texts, trees = {}, {}

    def parsed(path):
        if path not in texts:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                texts[path] = f.read()
            trees[path] = ast.parse(texts[path], filename=path)
        return texts[path], trees[path]

    def resolve(path, name):
        """'file:function' of a name used in path, if it is a function of the repository."""
        _, tree = parsed(path)
        if find_function(tree, name) is not None:
            return f"{path}:{name}"
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                source = node.module.replace(".", "/") + ".py"
                imported = any(a.name == name and a.asname is None for a in node.names)
                if imported and os.path.exists(os.path.join(root, source)):
                    return resolve(source, name)
        return None

    def body_code_lines(name):
        path, qualname = name.split(":")
        text, _ = parsed(path)
        first, end, _, _ = body_lines(text, path, qualname)
        return code_lines(text.splitlines()[first:end])

    assigned = {f for a in ASSIGNMENTS for f in a["functions"]}  # any assignment's: not given
    results = []
    for a in ASSIGNMENTS:
        if a["number"] not in numbers or not a["functions"]:
            continue
        helpers = {}
        for name in a["functions"]:
            path, qualname = name.split(":")
            for node in ast.walk(find_function(parsed(path)[1], qualname)):
                found = resolve(path, node.id) if isinstance(node, ast.Name) else None
                if found and found not in assigned:
                    helpers[found] = body_code_lines(found)
        results.append((a["number"], sum(body_code_lines(f) for f in a["functions"]), helpers))
    return results


def print_measure(results):
    print(f"{'assignment':>10s} {'you write':>10s} {'helpers':>8s}  "
          "given helpers the solution uses")
    for number, student, helpers in results:
        names = [f"{n.split(':')[1]} {c}" for n, c in sorted(helpers.items())] or ["-"]
        rows = [", ".join(names[i:i + 5]) for i in range(0, len(names), 5)]
        print(f"{number:10d} {student:10d} {sum(helpers.values()):8d}  " + f"\n{'':32s}".join(rows))
    print("(code lines: not blank, not only a comment, docstrings left out)")


def parse_numbers(text):
    known = {a["number"] for a in ASSIGNMENTS}
    items = [n.strip() for n in text.split(",") if n.strip()]
    if not items or not all(n.isdigit() and int(n) in known for n in items):
        raise SystemExit(f"error: --assignments takes numbers from {sorted(known)}, got {text!r}")
    return {int(n) for n in items}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", nargs="?",
                        help="directory to write the handout to (new or empty, outside the "
                             "repository)")
    parser.add_argument("--assignments", default=None,
                        help="comma-separated assignment numbers, e.g. 1,4 (default: every "
                             "implementation assignment)")
    parser.add_argument("--hidden", action="store_true",
                        help=f"keep the hidden tests ({HIDDEN}): the autograder's copy, never a "
                             "student's")
    parser.add_argument("--measure", action="store_true",
                        help="write nothing: print how many lines each assignment leaves to the "
                             "student and which given helpers its solution calls")
    args = parser.parse_args()
    chosen = (parse_numbers(args.assignments) if args.assignments else
              {a["number"] for a in ASSIGNMENTS if a["functions"]})
    if args.measure:
        print_measure(measure(chosen))
    elif args.dest:
        make_handout(args.dest, chosen, hidden=args.hidden)
    else:
        parser.error("give a directory to write the handout to, or --measure")
