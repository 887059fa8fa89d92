"""The addition task's text (data/addition/prepare.py) against hand-written traces, CharTask making
its data again when prepare.py changed, and checkpoints refusing data other than what they were
trained on."""

import importlib.util
import json
import os
import random
import textwrap

import pytest

import tasks.files as task_module
from tasks import CharTask, check_same_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("prepare",
                                              os.path.join(ROOT, "data", "addition", "prepare.py"))
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)


def test_traces_are_the_hand_written_column_additions():
    assert prepare.trace(52, 228) == "ones 2+8+0=10 c1;tens 5+2+1=08 c0;huns 0+2+0=02 c0;so 0280."
    assert prepare.trace(4, 2) == "ones 4+2+0=06 c0;tens 0+0+0=00 c0;huns 0+0+0=00 c0;so 0006."
    assert prepare.trace(999, 999) == "ones 9+9+0=18 c1;tens 9+9+1=19 c1;huns 9+9+1=19 c1;so 1998."
    assert prepare.prompt(52, 228) == " Q:52+228=?A:"


def test_every_answer_digit_sits_at_one_place_and_copies_one_place_of_the_trace():
    """Why the answer is zero-padded: digit i of the answer is always at the same position and
    equals the digit at one fixed position of the trace, so the masked-token head never has to work
    out the answer's length."""
    rng = random.Random(0)
    lengths, answers = set(), []
    for _ in range(500):
        a, b = rng.randint(0, 999), rng.randint(0, 9)  # a one-digit operand too: short sums
        text = prepare.trace(a, b)
        lengths.add(len(text))
        answers.append((text, a + b))
    assert lengths == {len(prepare.trace(0, 0))}  # every completion has the same length
    for text, total in answers:
        ones, tens, huns = text[11:13], text[28:30], text[45:47]  # column sums: '=', two digits
        assert text[-5:] == f"{huns[0]}{huns[1]}{tens[1]}{ones[1]}." == f"{total:04d}."


def write_dataset(folder, marker):
    """A one-problem dataset whose prepare.py writes `marker` as its single problem's answer."""
    os.makedirs(folder)
    with open(os.path.join(folder, "prepare.py"), "w") as f:
        f.write(textwrap.dedent(f"""
            import json, os
            here = os.path.dirname(os.path.abspath(__file__))
            for split in ("train", "val", "test"):
                with open(os.path.join(here, split + ".txt"), "w") as f:
                    f.write("Q:1+1=?A:\\tso {marker}.\\n")
            with open(os.path.join(here, "meta.json"), "w") as f:
                json.dump(dict(chars="Q:1+=?A so2345.\\n_", mask="_", stop="\\n",
                               answer_marker="so ", prompt_len=9, seq_len=16), f)
            """))


def change_prepare(folder, old, new):
    """Edit the dataset's prepare.py (as a pull would) and make it newer than the data it wrote."""
    with open(folder / "prepare.py") as f:
        text = f.read().replace(old, new)
    with open(folder / "prepare.py", "w") as f:
        f.write(text)
    meta = os.path.getmtime(folder / "meta.json")
    os.utime(folder / "prepare.py", (meta + 10, meta + 10))  # newer, even with coarse file times


def test_data_is_made_again_when_prepare_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(task_module, "DATA_DIR", str(tmp_path))
    folder = tmp_path / "toy"
    write_dataset(str(folder), "2")
    assert CharTask("toy").splits["test"] == [("Q:1+1=?A:", "so 2.")]  # made on first use

    with open(folder / "test.txt", "w") as f:  # the data is newer than prepare.py: used as it is
        f.write("Q:1+1=?A:\tso 3.\n")
    assert CharTask("toy").splits["test"] == [("Q:1+1=?A:", "so 3.")]

    change_prepare(folder, "so 2.", "so 4.")  # prepare.py changes (a pull): next use remakes data
    assert CharTask("toy").splits["test"] == [("Q:1+1=?A:", "so 4.")]
    with open(folder / "meta.json") as f:
        assert json.load(f)["answer_marker"] == "so "


def test_a_checkpoint_refuses_data_made_again_since(tmp_path, monkeypatch):
    """A checkpoint records the version (hash) of the data it was trained on; once prepare.py
    changed and the data was made again, grading or resuming it is refused with what to do. Old
    checkpoints carry no version."""
    monkeypatch.setattr(task_module, "DATA_DIR", str(tmp_path))
    folder = tmp_path / "toy"
    write_dataset(str(folder), "2")
    trained = {"data_version": CharTask("toy").data_version}
    check_same_data(trained, CharTask("toy"), "ckpt.pt")  # the same data, read again: accepted
    change_prepare(folder, "so 2.", "so 4.")
    changed = CharTask("toy")
    assert changed.data_version != trained["data_version"]
    with pytest.raises(ValueError, match="ckpt.pt was trained on another version of the data in "
                                         "toy .* train it again"):
        check_same_data(trained, changed, "ckpt.pt")
    check_same_data({}, changed, "old.pt")  # a checkpoint from before data versions: unchecked
