"""
The reading counts of bench/reading.py stay within the reader's budget: what a student reads to
follow one SBD training step, one plain decode and the exact mode, on the scale of nanoGPT's
training step and gpt-fast's decode loops (300 lines, 200 with at most 3 calls to the model, 150),
and the files a student opens to read the method whole stay within 2000 lines together.
"""

import pytest

from bench import reading

BUDGETS = {  # path -> (most lines, most calls from sample.py to the model)
    "train (one SBD step)": (300, None),
    "plain SBD decode": (200, 3),
    "exact greedy SBD decode": (150, 3),
    "exact sampled SBD decode": (150, 3),
}
READER_FILES_BUDGET = 2000  # model.py, sbd.py, train.py, sample.py, sampling.py, decode.py


def test_the_readers_files_stay_within_budget():
    files = reading.file_lines(reading.READER_FILES)
    assert set(files) == {"model.py", "sbd.py", "train.py", "sample.py", "sampling.py",
                          "decode.py"}
    assert sum(files.values()) <= READER_FILES_BUDGET, files


@pytest.mark.slow
def test_the_reading_paths_stay_within_budget():
    counts = reading.count_paths()
    assert set(counts) == set(BUDGETS)
    for path, (files, calls) in counts.items():
        most_lines, most_calls = BUDGETS[path]
        assert sum(files.values()) <= most_lines, (path, files)
        assert "model.py" in files or path != "train (one SBD step)", "training reads the model"
        assert "decode.py" in files or path.startswith("train"), "decoding reads decode.py"
        if most_calls is not None:
            assert 1 <= calls <= most_calls, (path, calls)

