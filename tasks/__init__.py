"""
Tasks with verifiable answers: load and tokenise them, make training batches, grade answers.

- CharTask (tasks/chars.py): a character-level task of data/<name>/, the demo's addition.
- JsonlTask (tasks/chat.py): instruction data for fine-tuning a chat model.
- BenchmarkTask (tasks/benchmark.py): a benchmark with verifiable answers for a chat model.
- tasks/solve.py: decoding many problems in left-padded batches and grading them.
- step_generator: the random stream of one training step's draws.
"""

import torch

from tasks.benchmark import BenchmarkTask, final_answer, read_benchmark
from tasks.chars import CharTask
from tasks.chat import JsonlTask, chat_prompt, read_jsonl
from tasks.files import check_same_data, data_version

__all__ = ["BenchmarkTask", "CharTask", "JsonlTask", "chat_prompt", "check_same_data",
           "data_version", "final_answer", "read_benchmark", "read_jsonl", "step_generator",
           "task_of_checkpoint"]


def task_of_checkpoint(checkpoint, checkpoint_path, tokenizer=None):
    """The task a checkpoint was trained on, refused if its data changed since: a data/ character
    task, or chat pairs (tokenizer: the checkpoint's, pretrained.tokenizer_of rebuilds it)."""
    if checkpoint["model_family"] == "llama":
        seq_len = checkpoint["config"]["seq_len"]
        task = JsonlTask(checkpoint["dataset"], tokenizer, seq_len)
    else:
        task = CharTask(checkpoint["dataset"])
    check_same_data(checkpoint, task, checkpoint_path)
    return task


def step_generator(seed, rank, iteration):
    """The generator of a training step's draws (its k, rows and noise): a function of (seed, rank,
    iteration) alone, so a resumed run draws what an uninterrupted one would."""
    return torch.Generator().manual_seed(hash((seed, rank, iteration)) % 2**63)
