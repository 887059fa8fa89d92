"""
What a student reads to follow one path through the method, counted on the code as it runs:

    python -m bench.reading

Each path runs a real command of the repository on a tiny model it trains here, under a tracer that
records which of the repository's functions run. A function that runs counts whole (its span from
def to last line, docstring included), once, however often it runs. A script's top level counts the
statements that run. Nothing of torch or the standard library counts.

- train: `python train.py` for one SBD step of a tiny model on the demo's task. What counts is what
  runs beneath train.py's top-level statements that run the model (the training loop), train.py's
  own statements in them included, model.py too: the step runs the whole model.
- the reader's files: every line of model.py, sbd.py, train.py, sample.py, sampling.py and
  decode.py, what a student opens to read the method whole.
- plain / exact greedy / exact sampled: `python sample.py --mode=sbd` on that checkpoint. What
  counts is what runs beneath sample.py's top-level statements that run the model, model.py
  excluded (read once for training). "calls to the model" is the longest chain of repository
  functions from sample.py's top level to the model's forward (decode.sbd -> decode.fill ->
  decode.hybrid_forward: each is one call).
"""

import ast
import os
import runpy
import sys
import tempfile
from collections import defaultdict
from contextlib import redirect_stdout
from io import StringIO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = os.path.join(ROOT, "model.py")
TINY = ["config/sbd_small.py", "--n_layer=1", "--n_head=2", "--n_embd=32", "--ntp_iters=0",
        "--sbd_starts_from=init", "--sbd_iters=1", "--report=False", "--eval_interval=1000",
        "--log_interval=1000"]
# the files a student opens for the method (sampling.py is the decoding file's token choice)
READER_FILES = ("model.py", "sbd.py", "train.py", "sample.py", "sampling.py", "decode.py")
DECODES = {"plain": ["--gamma=0.1"], "exact greedy": ["--exact=True"],
           "exact sampled": ["--exact=True", "--temperature=0.8"]}


class Spans:
    """(file, first line) of each function -> its span; a script's statements by line, and the
    top-level statement (its index in the module's body) that each line belongs to."""

    def __init__(self):
        self.parsed_files = {}

    def function(self, code):
        """(start, end) of the function whose code object this is, or None (a class body, a
        comprehension, a lambda: each is read as part of what holds it)."""
        return self.parsed(code.co_filename)[0].get(code.co_firstlineno)

    def statement(self, filename, line):
        """((start, end) of the statement starting at line or None, index of its top level)."""
        _, statements, top = self.parsed(filename)
        return statements.get(line), top.get(line)

    def parsed(self, filename):
        if filename not in self.parsed_files:
            with open(filename, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            functions, statements, top = {}, {}, {}
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    functions[first] = (first, node.end_lineno)
            for index, node in enumerate(tree.body):
                top.update(dict.fromkeys(range(node.lineno, node.end_lineno + 1), index))
            for node in top_level_statements(tree.body):
                statements.setdefault(node.lineno, header(node))
            self.parsed_files[filename] = functions, statements, top
        return self.parsed_files[filename]


def top_level_statements(body):
    """A script's statements outside functions and classes, nested ones included."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from top_level_statements(getattr(node, field, []))
        for handler in getattr(node, "handlers", []):
            yield from top_level_statements(handler.body)


def header(node):
    """The lines a statement adds by itself: a compound one its header, a simple one all of it."""
    body = getattr(node, "body", None)
    if body and isinstance(body, list):
        return node.lineno, max(node.lineno, body[0].lineno - 1)
    return node.lineno, node.end_lineno


class Tracer:
    """Runs beneath a script's top-level statements: for each, the repository's functions that
    ran beneath it (and, if count_script, the script's own statements in it that ran), and whether
    it ran the model (a forward of model.py). Also the longest chain of repository functions
    from the script's top level to the model."""

    def __init__(self, script, count_script):
        self.spans, self.script, self.count_script = Spans(), script, count_script
        self.ran = defaultdict(set)  # top-level statement -> {(file, start, end)}
        self.reached_model = set()  # top-level statements that ran the model
        self.current = None  # the top-level statement running now
        self.depth_to_model = 0

    def in_repository(self, filename):
        # a virtual environment may live inside the checkout (CI's .venv): its packages are not ours
        installed = (filename.startswith(sys.prefix + os.sep)
                     or f"{os.sep}site-packages{os.sep}" in filename)
        return (filename.startswith(ROOT) and filename.endswith(".py")
                and "/tests/" not in filename and not installed)

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if not self.in_repository(code.co_filename):
            return None
        if code.co_name == "<module>":
            return self.line if code.co_filename == self.script else None
        span = self.spans.function(code)
        if span is None or self.current is None:
            return None
        if code.co_filename == MODEL_FILE and code.co_name == "forward":
            self.reached_model.add(self.current)
            self.depth_to_model = max(self.depth_to_model, self.depth(frame))
        self.ran[self.current].add((code.co_filename, *span))
        return None

    def depth(self, frame):
        """Repository functions outside model.py between the script's top level and frame."""
        n = 0
        while frame is not None and frame.f_code.co_filename != self.script:
            name = frame.f_code.co_filename
            if self.in_repository(name) and name != MODEL_FILE and self.spans.function(
                    frame.f_code):
                n += 1
            frame = frame.f_back
        return n

    def line(self, frame, event, arg):
        if event == "line" and frame.f_code.co_name == "<module>":
            span, self.current = self.spans.statement(self.script, frame.f_lineno)
            if span is not None and self.count_script:
                self.ran[self.current].add((self.script, *span))
        return self.line

    def path(self):
        """The spans beneath the top-level statements that ran the model."""
        return set().union(*(self.ran[i] for i in self.reached_model))


def run_script(script, argv, tracer):
    """script's __main__ with argv, traced; its output kept out of the table."""
    old_argv, sys.argv = sys.argv, [script, *argv]
    sys.settrace(tracer)
    try:
        with redirect_stdout(StringIO()):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        sys.settrace(None)
        sys.argv = old_argv


def lines_by_file(ran, skip=()):
    """{file: lines} over the spans that ran; spans that overlap count their lines once."""
    lines = defaultdict(set)
    for filename, start, end in ran:
        if filename not in skip:
            lines[os.path.relpath(filename, ROOT)].update(range(start, end + 1))
    return {name: len(seen) for name, seen in lines.items()}


def count_paths():
    """{path: ({file: lines}, calls from sample.py to the model or None)} on a tiny model."""
    results = {}
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as out_dir:
        tracer = Tracer(os.path.join(ROOT, "train.py"), count_script=True)
        run_script("train.py", [*TINY, f"--out_dir={out_dir}"], tracer)
        results["train (one SBD step)"] = (lines_by_file(tracer.path()), None)
        for name, extra in DECODES.items():
            tracer = Tracer(os.path.join(ROOT, "sample.py"), count_script=False)
            run_script("sample.py", [f"--out_dir={out_dir}", "--mode=sbd", "--compile=False",
                                     "--max_new_tokens=24", *extra], tracer)
            results[f"{name} SBD decode"] = (lines_by_file(tracer.path(), skip=(MODEL_FILE,)),
                                             tracer.depth_to_model)
    return results


def file_lines(names):
    """{name: lines} of files at the repository's root, every line counted (blank and comment)."""
    counts = {}
    for name in names:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            counts[name] = sum(1 for _ in f)
    return counts


def main():
    files = file_lines(READER_FILES)
    print(f"the reader's files: {sum(files.values())} lines "
          + ", ".join(f"{name} {n}" for name, n in files.items()))
    for path, (files, depth) in count_paths().items():
        calls = "" if depth is None else f", {depth} calls from sample.py to the model"
        print(f"{path}: {sum(files.values())} lines{calls}")
        for name, n in sorted(files.items(), key=lambda item: -item[1]):
            print(f"  {name:28s} {n:4d}")


if __name__ == "__main__":
    main()
