"""Before collecting: the packages every test imports. Without them pytest would print one
collection error per test file; one line saying what to install is more use to a new user."""

import importlib.util

import pytest

MISSING = [name for name in ("torch", "tiktoken", "numpy")
           if importlib.util.find_spec(name) is None]


def pytest_configure(config):
    if MISSING:
        pytest.exit(f"missing packages: {', '.join(MISSING)}. Install them first (README, Quick "
                    "start): pip install torch==2.13.0 && pip install -r requirements.txt",
                    returncode=4)
