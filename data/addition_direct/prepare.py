"""
Column addition with the answer right after the prompt, no written-out trace:

    prompt " Q:52+228=?A:"   completion "0280."   then the stop character "\\n"

The same problems, splits and vocabulary as data/addition (whose prepare.py makes them): only the
completion differs. Each answer digit depends on carries from digits not yet written, so filling
them in one forward cannot be reliable; this is the task that shows why reasoning traces suit SBD
(assignments/12_traces.md).

Run: python data/addition_direct/prepare.py   (train.py --dataset=addition_direct runs it)
"""

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "addition_prepare", os.path.join(HERE, "..", "addition", "prepare.py"))
addition = importlib.util.module_from_spec(spec)
spec.loader.exec_module(addition)

if __name__ == "__main__":
    addition.main(HERE, direct=True)
