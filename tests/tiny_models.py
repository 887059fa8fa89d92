"""Tiny random models shared by the tests (imported by name: pytest puts tests/ on sys.path)."""

import torch

from pretrained.shapes import build_model


def random_model(family, seed=0, std=0.1, dtype=torch.float32):
    """build_model(family) with every matrix redrawn from N(0, std), in eval mode."""
    torch.manual_seed(seed)
    m = build_model(family)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return m.to(dtype).eval()


def ntp(model, prompt, max_new_tokens, stop_ids=(), temperature=0.0, top_k=None, generator=None,
        mask_id=None, top_p=None):
    """serving.batched.ntp_generate with its settings record built from loose arguments."""
    from sampling import DecodeSettings
    from serving import batched

    settings = DecodeSettings(mask_id=mask_id, stop_ids=tuple(stop_ids), temperature=temperature,
                              top_k=top_k, top_p=top_p)
    return batched.ntp_generate(model, prompt, settings, max_new_tokens, generator)
