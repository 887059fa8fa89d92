"""
Staff only (STAFF_ONLY in assignments/assignments.py): the structural leak check, which
tests/test_assignments.py runs on every handout, and the proof that it finds a planted copy of a
blanked body with its names renamed, reformatted and without comments. It covers the handout's
tests too, and the hidden tests' reference implementations (tests/hidden/: reference_sbd, the rules
by hand, ...), which a student's handout must not hold in any form either.
"""

import ast
import builtins
import os
import re
import textwrap

from test_assignments import BLANKS, BY_NUMBER, ROOT, course, handout

# The structural check: a copy with its variables renamed, reformatted or without comments. A body
# and every unit of the handout (a function or method, a module's top-level code, a code span of a
# Markdown file) become the pre-order sequence of their syntax tree's nodes, with the unit's own
# names (parameters, assigned names) and every constant abstracted, and the rest kept: node types,
# attribute and keyword names (torch's API), names of the module's globals (helpers, imports). A
# leak is a run of RUN consecutive nodes of a blanked body in another unit. Ordinary code shares at
# most 13 with a body (block_forward and train.py's get_batch: a torch.cat and two slices); a
# renamed copy of a statement or two is longer. Bodies of fewer than RUN nodes (the one-line masks,
# entropy) are left to test_assignments.py's line check.
RUN = 16
SHARED = {  # (blanked body, unit of the handout): why the run they share is not a solution
    ("decode.py:sbd", "decode.py:ntp"):
        "the reference decoders' common start: the clock, the cache, the prefill, the loop",
    ("decode.py:sbd", "decode.py:exact"):
        "the reference decoders' common start: the clock, the cache, the prefill, the loop",
    ("decode.py:fill", "serving/batched.py:ntp_generate"): "the stop ids as a tensor on the device",
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


def hidden_references():
    """'file:function' of the reference implementations in the hidden tests: their module-level
    functions that compute something (no test, no assert: a checker is no solution; a class is
    a test double)."""
    folder = os.path.join(ROOT, course.HIDDEN)
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            found += [f"{course.HIDDEN}{name}:{node.name}" for node in tree.body
                      if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_")
                      and not any(isinstance(n, ast.Assert) for n in ast.walk(node))]
    return found


def structural_leaks(directory, numbers, files, references=()):
    """Where the handout's files (in directory, its tests included, the hidden tests not) hold a
    run of RUN nodes of a body blanked for `numbers`, or of a hidden reference ('file:qualname' in
    references) -> ["file:qualname: in file:unit"], less the SHARED pairs."""
    grams, known = {}, set(dir(builtins))
    sources = {}
    for path in files:
        if path.startswith(course.HIDDEN) or not path.endswith((".py", ".md")):
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
    bodies = [f for n in numbers for f in BY_NUMBER[n]["functions"]] + list(references)
    for function in bodies:
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
    for function in (f for n in BLANKS for f in BY_NUMBER[n]["functions"]):
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
                             "sbd.py:hybrid_mask", "sbd.py:shift_read_at"]
    (tmp_path / "planted.py").write_text("\n\n".join(code for _, code in copies) + "\n")
    found = structural_leaks(tmp_path, BLANKS, ["planted.py"])
    assert {f.split(": in ")[0] for f in found} == {function for function, _ in copies}
    assert all(": in planted.py:helper_" in f for f in found), found
    fill = next(code for function, code in copies if function.endswith(":fill"))
    notes = "notes" + ".md"  # (spelled apart: test_repository.py reads ".md" names as references)
    (tmp_path / notes).write_text(f"A loop:\n\n```python\n{fill}\n```\n")
    found = structural_leaks(tmp_path, [5], [notes])
    assert found == [f"decode.py:fill: in {notes}:code span 0"], found


def test_the_check_finds_a_hidden_reference_in_a_handouts_tests(tmp_path):
    """A renamed copy of the hidden tests' reference decoder, planted in a test file of a
    handout, is found; so is the uncached block logits helper, which the reference calls."""
    references = hidden_references()
    assert {f"{course.HIDDEN}test_hidden_decoding.py:reference_sbd",
            f"{course.HIDDEN}test_hidden_decoding.py:uncached_block_logits",
            f"{course.HIDDEN}test_hidden_assignment_13.py:uncached_shifted_sbd",
            f"{course.HIDDEN}test_hidden_reveal_rules.py:by_hand_entropy",
            f"{course.HIDDEN}test_hidden_llama.py:meta_rotary"} <= set(references)
    planted = []
    for name in ("reference_sbd", "uncached_block_logits"):
        with open(os.path.join(ROOT, course.HIDDEN, "test_hidden_decoding.py")) as f:
            node = handout.find_function(ast.parse(f.read()), name)
        node.body = node.body[1:]  # no docstring
        node = Rename(own_names(node)).visit(node)
        node.name, node.decorator_list = f"helper_{name}", []
        planted.append(ast.unparse(node))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_planted.py").write_text("\n\n".join(planted) + "\n")
    found = structural_leaks(tmp_path, [], ["tests/test_planted.py"], references)
    assert {f.split(": in ")[0].split(":")[1] for f in found} >= {"reference_sbd",
                                                                   "uncached_block_logits"}, found


# The write-ups: no code span states an expression of a blanked body. Every expression of a body
# that computes (an operator, an attribute, a subscript) and has EXPR nodes or more, its own names
# and constants abstracted as above, is compared with every expression in the write-ups' code
# spans. A write-up may name a function with its parameters, a shape or a helper, but not hand over
# a piece of the solution. EXPR = 6 finds the paper's label rule, a single torch.where.
EXPR = 6
COMPUTES = {"BinOp", "BoolOp", "Compare", "UnaryOp", "Subscript"}


def expressions(nodes, own):
    """The structure of every expression under the statements that computes, of EXPR tokens or
    more."""
    found = set()
    for node in (n for statement in nodes for n in ast.walk(statement)):
        if isinstance(node, ast.expr):
            tokens = tuple(structure([ast.Expr(value=node)], own))[1:]  # without the Expr
            computes = any(t in COMPUTES or t.startswith(".") for t in tokens)
            if len(tokens) >= EXPR and computes:
                found.add(tokens)
    return found


def writeup_expressions_of_solutions(writeups, numbers):
    """["writeup: code span i"] whose code holds an expression of a body blanked for numbers."""
    bodies = set()
    for n in numbers:
        for function in BY_NUMBER[n]["functions"]:
            path, qualname = function.split(":")
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                node = handout.find_function(ast.parse(f.read()), qualname)
            body = node.body[1:] if handout.docstring_of(node) is not None else node.body
            bodies |= expressions(body, own_names(node))
    known = set(dir(builtins))  # the repository's globals keep their names, as in the bodies
    for path in {f.split(":")[0] for n in numbers for f in BY_NUMBER[n]["functions"]}:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        known |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Name)}
        known |= {n.name for n in tree.body if isinstance(n, handout.DEFINITIONS)}
        known |= {(a.asname or a.name).split(".")[0] for n in tree.body
                  if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    found = []
    for name, text in writeups.items():
        for unit, nodes, own in markdown_units(text, known):
            if expressions(nodes, own) & bodies:
                found.append(f"{name}: {unit}")
    return found


def test_no_writeup_states_a_solution_expression(tmp_path):
    """Every write-up, against the bodies of every assignment; and the check finds a line of a
    body written into a write-up's prose as inline code."""
    writeups = {}
    for a in course.ASSIGNMENTS:
        with open(os.path.join(ROOT, "assignments", a["writeup"]), encoding="utf-8") as f:
            writeups[a["writeup"]] = f.read()
    assert writeup_expressions_of_solutions(writeups, BLANKS) == []
    planted = {"planted": "Label the slots `torch.where(is_masked, x, IGNORE_INDEX)` and go on."}
    assert writeup_expressions_of_solutions(planted, [2]) == ["planted: code span 0"]
