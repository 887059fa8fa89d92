"""
The repository as a reader meets it: every document it points to is in it, imports flow one way,
the files a student reads for the method stay readable in one sitting, and ruff is clean.
"""

import ast
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT_FILES = (".py", ".md", ".sh", ".toml", ".ini", ".txt")
# a path-like reference to a document: letters, digits, _ . - / ending in .md (URLs are skipped)
DOCUMENT = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
# what a student reads for the method, and the budget that keeps each readable in one sitting
# (model.py: 640 before the static cache, 670 before the block adapter; train.py: 460 before it
# and the time-left estimate)
LINE_BUDGET = {"sbd.py": 450, "serving/batched.py": 450, "decode.py": 300, "sampling.py": 450,
               "serving/exact.py": 480, "train.py": 560, "sample.py": 450, "model.py": 835}
MAX_ROOT_FILES = 9  # the root holds what a student reads for the method; support code has folders
MAX_FILE_LINES = 700  # any other .py file
OTHER_BUDGETS = {"data/wordproblems/prepare.py": 880}  # templates and word lists, not logic


def tracked_files():
    """The files git tracks, plus new ones it does not ignore (what a clone or handout holds)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if os.path.exists(os.path.join(ROOT, f))]


def unresolved(files, pattern, root=ROOT, known=lambda ref: False):
    """[(file:line, reference)] for every match of pattern in the text files that resolves to no
    file of the repository, neither from its root nor from the referring file's folder, and that
    known(reference) does not excuse."""
    missing = []
    for name in files:
        if not name.endswith(TEXT_FILES):
            continue
        with open(os.path.join(root, name), encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                for ref in pattern.findall(re.sub(r"https?://\S+", "", line)):
                    places = [os.path.join(root, ref),
                              os.path.join(root, os.path.dirname(name), ref)]
                    if not (known(ref) or any(os.path.exists(p) for p in places)):
                        missing.append((f"{name}:{line_no}", ref))
    return missing


def missing_documents(files, root=ROOT):
    """unresolved .md references."""
    return unresolved(files, DOCUMENT, root)


def test_every_document_referred_to_is_in_the_repository():
    assert missing_documents(tracked_files()) == []


def test_the_document_check_finds_a_missing_one(tmp_path):
    md = ".md"  # (spelled apart, so that this file itself refers to nothing)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / f"method{md}").write_text(f"see NOTES{md} and docs/method{md}\n")
    (tmp_path / "a.py").write_text(f"# docs/method{md}, Inference; FINDINGS{md}; https://x.org/y{md}\n")
    found = missing_documents([f"docs/method{md}", "a.py"], root=str(tmp_path))
    assert found == [(f"docs/method{md}:1", f"NOTES{md}"), ("a.py:1", f"FINDINGS{md}")]


# a path-like reference to a Python file, as DOCUMENT for .md
SCRIPT = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w-]+\.py)\b")
UPSTREAM = {"convert_hf_to_gguf.py", "convert_llama_weights_to_hf.py"}  # other projects' scripts
EXAMPLES = {"file.py", "tests/test_x.py"}  # placeholders in the course's instructions


def missing_scripts(files, root=ROOT):
    """unresolved .py references outside tests/ (whose fixtures name files they make); a bare name
    of a file somewhere in the repository ('prepare.py') and other projects' scripts resolve."""
    names = {os.path.basename(f) for f in files}
    known = lambda ref: ref in UPSTREAM | EXAMPLES or "/" not in ref and ref in names
    return unresolved([f for f in files if not f.startswith("tests/")], SCRIPT, root, known)


def test_every_script_referred_to_is_in_the_repository():
    assert missing_scripts(tracked_files()) == []


def test_the_script_check_finds_a_stale_one(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "gpu.py").write_text("")
    md = "." + "md"  # (spelled apart, so that this file itself refers to nothing)
    (tmp_path / f"a{md}").write_text("run bench/gpu.py, not bench_gpu.py or bench/old.py\n")
    found = missing_scripts(["bench/gpu.py", f"a{md}"], root=str(tmp_path))
    assert found == [(f"a{md}:1", "bench_gpu.py"), (f"a{md}:1", "bench/old.py")]


def python_files():
    """The repository's .py files, as paths relative to its root (tests and the course included)."""
    return sorted(f for f in tracked_files() if f.endswith(".py"))


def module_name(path):
    """'pretrained/load_llama.py' -> 'pretrained.load_llama'; a package's __init__.py: its name."""
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def project_imports():
    """{module: the project modules it imports} for every .py file of the repository, in any folder
    (imports anywhere in the file count, function-level ones included). A module is named by its
    path ('bench.roofline'); importing a package's module counts as importing that module."""
    modules = {module_name(f): f for f in python_files()}
    graph = {}
    for module, path in modules.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module)
                imported |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[module] = sorted(imported & set(modules) - {module})
    return graph


def find_cycle(graph):
    """A list of modules that import each other in a circle, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return None


def test_imports_flow_one_way():
    assert find_cycle(project_imports()) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]  # can fail


@pytest.mark.parametrize("name, budget", sorted(LINE_BUDGET.items()))
def test_method_files_fit_in_one_sitting(name, budget):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        n = sum(1 for _ in f)
    assert n <= budget, f"{name} has {n} lines, over its budget of {budget}: split it"


def test_the_root_holds_only_the_method_files():
    root = [f for f in python_files() if "/" not in f]
    assert len(root) <= MAX_ROOT_FILES, f"{len(root)} .py files at the root: {root}"


def test_every_file_has_a_line_budget():
    for path in python_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        budget = LINE_BUDGET.get(path, OTHER_BUDGETS.get(path, MAX_FILE_LINES))
        assert n <= budget, f"{path} has {n} lines, over its budget of {budget}: split it"


MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in python_files():
        if path.startswith("tests/"):
            continue
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        long += [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
                 for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: split them"


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        words = len(f.read().split())
    assert words <= 2000, f"README.md has {words} words: details belong in docs/"


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install ruff)")
def test_ruff_is_clean():
    done = subprocess.run(["ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:]
