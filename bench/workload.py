"""
What the benchmarks decode: a random GPT of the settings' shape, or out_dir's trained checkpoint
with its task's problems and its calibrated decode settings; and problems decoded in left-padded
batches as evaluate.py decodes them (tasks/solve.py).
"""

import os

import torch

from checkpoint import load_checkpoint, read_calibration, settings_for
from configurator import ConfigError, resolve_dtype
from pretrained.shapes import build_model
from tasks import task_of_checkpoint
from tasks.solve import decode_batches


def gpt_shape(cfg):
    """The random GPT's shape from the settings, as build_model's keywords."""
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                block_size=cfg.block_size, vocab_size=cfg.vocab_size)


def random_gpt(cfg, shape=None):
    """A GPT with random weights (torch seeded with cfg.seed first) of `shape` (build_model's
    keywords), by default the settings' (gpt_shape)."""
    torch.manual_seed(cfg.seed)
    return build_model("gpt", **(shape or gpt_shape(cfg))).to(cfg.device).eval()


def checkpoint_path(cfg):
    return os.path.join(cfg.out_dir, "ckpt_sbd.pt")


def load_trained(cfg, n_problems):
    """out_dir's checkpoint in decode_dtype -> (model, task, its first n_problems problems: the
    demo's test problems, or a chat model's benchmark problems, checkpoint, calibration)."""
    from pretrained.loading import tokenizer_of

    path = checkpoint_path(cfg)
    model, checkpoint = load_checkpoint(path, cfg.device)
    model = model.to(getattr(torch, resolve_dtype(cfg.decode_dtype, cfg.device)))
    tokenizer = (tokenizer_of(checkpoint["tokenizer"]) if checkpoint["model_family"] == "llama"
                 else None)
    task = task_of_checkpoint(checkpoint, path, tokenizer)
    problems = (task.splits.get("test") or task.splits["val"])[:n_problems]
    return model, task, problems, checkpoint, read_calibration(path, checkpoint)


def trained_settings(cfg, checkpoint, calibration, exact_gamma=None):
    """-> (plain SBD's DecodeSettings, or None where it has no γ; exact SBD's), at --k, else the
    calibration's k, with --rule. A trained checkpoint's k and γ come from its calibration
    (checkpoint.settings_for) unless given: a γ only means something for the block size it was
    calibrated with. Plain SBD's γ is --gamma, else γ_low; exact SBD's is exact_gamma, else the
    calibrated one (its output is NTP's whatever γ is)."""
    exact = settings_for(checkpoint, calibration, k=cfg.k or None, gamma=exact_gamma, exact=True,
                         rule=cfg.rule)
    try:
        plain = settings_for(checkpoint, calibration, k=exact.k, gamma=cfg.gamma, rule=cfg.rule)
    except ConfigError as e:
        print(f"plain SBD not measured: {e}")
        plain = None
    return plain, exact


def decode_problems(model, task, problems, settings, batch_size, ntp=False):
    """Every problem decoded as evaluate.py decodes them (tasks.solve.decode_batches) -> (output
    ids in problem order, [DecodeStats per batch])."""
    outputs, all_stats = [None] * len(problems), []
    for indices, out, stats in decode_batches(model, task, problems, settings, batch_size, ntp):
        for i, ids in zip(indices, out):
            outputs[i] = ids
        all_stats.append(stats)
    return outputs, all_stats
