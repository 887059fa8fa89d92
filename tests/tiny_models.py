"""Tiny random models shared by the tests (imported by name: pytest puts tests/ on sys.path)."""

import torch

import model as model_lib


def random_model(family, seed=0, std=0.1, dtype=torch.float32):
    """model_lib.build_model(family) with every matrix redrawn from N(0, std), in eval mode."""
    torch.manual_seed(seed)
    m = model_lib.build_model(family)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return m.to(dtype).eval()
