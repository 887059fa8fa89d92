"""
Write a student copy of this repository with some assignments' functions blanked.

    python assignments/handout.py ../sbd-handout                    # all implementation assignments (1-6)
    python assignments/handout.py ../sbd-handout --assignments 1,4  # only these

The copy holds the repository's files (tracked, plus new files git does not ignore; no .git, no virtual
environment, no out*/ runs, no generated data). Each function that assignments.py names for the chosen
assignments keeps its signature and docstring (the specification); the rest of its body becomes
    raise NotImplementedError("assignment N: file:name")
The function is found on the syntax tree (ast) and exactly the lines of its body after the docstring are
replaced, so every other line of every file stays as it is: the source needs no solution markers.
There is no solutions mode to generate: the solutions are this repository.
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
from assignments import ASSIGNMENTS, SPECS, STAFF_ONLY  # noqa: E402  (the list next to this file)


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def find_function(tree, qualname):
    """The FunctionDef of 'f' or 'Class.f' at the top level of a module, or None."""
    node = tree
    for part in qualname.split("."):
        found = [n for n in getattr(node, "body", []) if isinstance(n, DEFINITIONS) and n.name == part]
        if not found:
            return None
        node = found[-1]  # a later definition replaces an earlier one, as when Python runs the file
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def docstring_of(func):
    first = func.body[0]
    is_string = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return first if is_string and isinstance(first.value.value, str) else None


def body_lines(text, path, qualname):
    """-> (first, end, indent, has_docstring): the function's body after its docstring is lines[first:end]
    (0-based, end exclusive), including comment lines indented under it; indent = the body's indentation."""
    func = find_function(ast.parse(text, filename=path), qualname)
    if func is None:
        raise SystemExit(f"error: {path}:{qualname} does not exist (renamed? update assignments/assignments.py)")
    doc = docstring_of(func)
    if doc is not None and len(func.body) == 1:
        raise SystemExit(f"error: {path}:{qualname} has nothing but a docstring to blank")
    start = func.body[1] if doc is not None else func.body[0]
    if start.lineno == func.lineno or (doc is not None and start.lineno == doc.end_lineno):
        raise SystemExit(f"error: {path}:{qualname} must have its body on lines of its own to be blanked")
    lines = text.splitlines(keepends=True)
    indented_comment = lambda line: line.lstrip().startswith("#") and len(line) - len(line.lstrip()) > func.col_offset
    if doc is not None:
        first = doc.end_lineno  # 0-based index of the line after the docstring
    else:  # and the comment lines between the signature and the first statement
        first = start.lineno - 1
        while first - 1 >= func.lineno and indented_comment(lines[first - 1]):
            first -= 1
    end = func.end_lineno
    for j in range(func.end_lineno, len(lines)):  # comments indented under the function after its last statement
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
            raise SystemExit(f"error: {name} has a docstring now: remove its entry from SPECS in assignments.py")
        if not has_doc and name not in SPECS:
            raise SystemExit(f"error: {name} has no docstring to serve as its specification: add one to the "
                             "source, or an entry to SPECS in assignments.py")
        new = spec_docstring(name, indent) if name in SPECS else []
        new.append(f'{indent}raise NotImplementedError("assignment {number}: {name}")\n')
        spans.append((first, end, new))
    lines = text.splitlines(keepends=True)
    for first, end, new in sorted(spans, reverse=True):  # from the bottom up, so earlier line numbers stay valid
        lines[first:end] = new
    blanked = "".join(lines)
    ast.parse(blanked, filename=path)  # still valid Python
    return blanked


def repository_files(root):
    """Files a handout copies: tracked, plus untracked ones .gitignore does not exclude, minus STAFF_ONLY."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"error: {root} is not a git checkout; make handouts from a clone of the repository")
    files = sorted(set(f for f in listed.split("\0") if f))
    return [f for f in files if f not in STAFF_ONLY and os.path.isfile(os.path.join(root, f))]


def targets_by_file(numbers):
    """{file: [(assignment number, qualname), ...]} for the chosen assignments; a function named twice is an error."""
    by_file, seen = {}, {}
    for a in ASSIGNMENTS:
        if a["number"] in numbers:
            for name in a["functions"]:
                if name in seen:
                    raise SystemExit(f"error: {name} is in assignments {seen[name]} and {a['number']}")
                seen[name] = a["number"]
                path, qualname = name.split(":")
                by_file.setdefault(path, []).append((a["number"], qualname))
    return by_file


def make_handout(dest, numbers, root=ROOT):
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and os.listdir(dest):
        raise SystemExit(f"error: {dest} exists and is not empty")
    if os.path.commonpath([dest, root]) == root:
        raise SystemExit(f"error: write the handout outside the repository (e.g. {os.path.dirname(root)}/handout)")
    by_file = targets_by_file(numbers)
    files = repository_files(root)
    missing = sorted(set(by_file) - set(files))
    if missing:
        raise SystemExit(f"error: assignments.py names functions in {missing}, which the repository does not have")
    for f in files:
        src, dst = os.path.join(root, f), os.path.join(dest, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
        if f in by_file:
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
            with open(dst, "w", encoding="utf-8") as fh:
                fh.write(blank_file(text, f, by_file[f]))
    with open(os.path.join(dest, "assignments", "handout.json"), "w") as fh:  # grade.py's default selection
        json.dump({"assignments": sorted(numbers)}, fh)
    n_blanked = sum(len(t) for t in by_file.values())
    print(f"wrote {len(files)} files to {dest}: assignments {sorted(numbers)}, {n_blanked} functions blanked")
    print(f"students: cd {dest} && python assignments/grade.py")


def parse_numbers(text):
    known = {a["number"] for a in ASSIGNMENTS}
    items = [n.strip() for n in text.split(",") if n.strip()]
    if not items or not all(n.isdigit() and int(n) in known for n in items):
        raise SystemExit(f"error: --assignments takes numbers from {sorted(known)}, got {text!r}")
    return {int(n) for n in items}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", help="directory to write the handout to (new or empty, outside the repository)")
    parser.add_argument("--assignments", default=None,
                        help="comma-separated assignment numbers, e.g. 1,4 (default: every implementation assignment)")
    args = parser.parse_args()
    chosen = (parse_numbers(args.assignments) if args.assignments else
              {a["number"] for a in ASSIGNMENTS if a["kind"] == "implementation"})
    make_handout(args.dest, chosen)
