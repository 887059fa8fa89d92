"""train.py's support code: training on several processes (parallel.py)."""
