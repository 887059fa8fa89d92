"""
The graded experiments (assignments 14-16): the numbers a student reports in answers.toml are
those that the experiment, run again here from the same seed with the same code, gives, within
assignments/experiments.py's tolerances. The answers are read from SBD_ANSWERS, which grade.py
sets to the answers it grades; without it the tests skip. Each test runs one experiment: 20-40 s
on a 2-core CPU.
"""

import importlib.util
import os

import pytest
import tomllib
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBERS = {"leak": 14, "ntp": 15, "shift": 16}


def experiments():
    spec = importlib.util.spec_from_file_location(
        "course_experiments", os.path.join(ROOT, "assignments", "experiments.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answers_of(number):
    """[assignment_N] of the answers file grade.py names in SBD_ANSWERS: {question: list of
    numbers}. Outside grade.py there is nothing to check (tests/test_assignments.py grades the
    reference's answers through grade.py)."""
    path = os.environ.get("SBD_ANSWERS")
    if not path:
        pytest.skip(f"a graded experiment: python assignments/grade.py --assignments {number}")
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        return tomllib.load(f).get(f"assignment_{number}", {})


def check_reported(name, tmp_path, course):
    number = NUMBERS[name]
    given = answers_of(number)
    wanted = course.REPORTED[name]
    missing = [q for q in wanted if not isinstance(given.get(q), list)
               or len(given[q]) != len(wanted[q])]
    if missing:
        pytest.fail(f"not answered: {', '.join(missing)} of [assignment_{number}] (run python "
                    f"assignments/experiments.py {name} and report what its write-up asks)")
    results = course.run(name, str(tmp_path))
    again = course.reported(name, results)
    for q, items in wanted.items():
        for i, (arm, what) in enumerate(items):
            tolerance, reported = course.TOLERANCE[what], given[q][i]
            assert abs(reported - again[q][i]) <= tolerance, (
                f"{q}[{i}], {what} of the arm '{arm}': you report {reported}, the same seeded run "
                f"gives {again[q][i]} here (tolerance ±{tolerance}). Report what your code gives "
                f"on this run: python assignments/experiments.py {name}")


def test_leak_numbers_are_what_the_run_gives(tmp_path):
    course = experiments()
    q = torch.arange(6)
    course.leaky_training_mask(q[:, None], q[None, :], 3, 2)  # your change runs (a stub does not)
    check_reported("leak", tmp_path, course)


def test_ntp_numbers_are_what_the_run_gives(tmp_path):
    check_reported("ntp", tmp_path, experiments())


def test_shift_numbers_are_what_the_run_gives(tmp_path):
    check_reported("shift", tmp_path, experiments())
