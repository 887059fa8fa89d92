"""
Where a task's data lives and which version of it a checkpoint saw: data/<name>/ is made by its
prepare.py on first use (nothing downloads), and a checkpoint records a hash of the files it was
trained on, so it is never graded on, or resumed with, other data.
"""

import hashlib
import os
import subprocess
import sys

from configurator import ConfigError

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def data_version(paths):
    """A short hash of these files' bytes. A checkpoint records it, so a model is never graded on,
    or resumed with, data other than what it was trained on (e.g. after a pull changed prepare.py
    and the data was made again)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def prepared_folder(name, made_file):
    """data/<name>/, its data made by its prepare.py on first use (nothing downloads) and again when
    a generator is newer than made_file (like make: a changed task must not meet old data)."""
    folder = os.path.join(DATA_DIR, name)
    prepare = os.path.join(folder, "prepare.py")
    if not os.path.exists(prepare):
        known = sorted(d for d in os.listdir(DATA_DIR)
                       if os.path.exists(os.path.join(DATA_DIR, d, "prepare.py")))
        raise ConfigError(f"unknown dataset {name!r}: no {prepare}. Known datasets: {known}")
    made = os.path.join(folder, made_file)
    # a variant task (data/addition_direct) runs another task's generator: any newer one counts
    generators = [os.path.join(DATA_DIR, d, "prepare.py") for d in os.listdir(DATA_DIR)]
    newest = max(os.path.getmtime(g) for g in generators if os.path.exists(g))
    if not os.path.exists(made) or newest > os.path.getmtime(made):
        print(f"preparing dataset {name} ...")
        subprocess.run([sys.executable, prepare], check=True)
    return folder

def check_same_data(checkpoint, task, checkpoint_path):
    """Refuse a checkpoint trained on another version of the task's data. Checkpoints from before
    the version was recorded carry none and pass unchecked."""
    trained_on = checkpoint.get("data_version")
    if trained_on is not None and trained_on != task.data_version:
        raise ConfigError(f"{checkpoint_path} was trained on another version of the data in "
                         f"{task.name} (version {trained_on}; on disk now: {task.data_version}), "
                         "e.g. its prepare.py changed since. Its answers would be graded, or its "
                         "training resumed, on data it never saw: train it again "
                         "(init_from='scratch'), or check out the commit it was trained at")
