"""
What a training run will cost, printed as it goes: the time left at the pace measured so far, and
the memory a block adapter's SBD stage needs before activations. train.py calls these.
"""

from sbd import is_adapter


def sbd_step_work(adapter, copies, sbd_rows, ntp_rows):
    """An SBD step's work in NTP steps, per row 1 + copies for a full step's forward and backward
    over the clean half and the noisy copies; an adapter's is 2/3 of that over the copies (no
    gradients of the frozen weights) and 1/3 for the clean half's forward alone."""
    per_row = (1 + 2 * copies) / 3 if adapter else 1 + copies  # an NTP row's work is 1
    return per_row * sbd_rows / ntp_rows


def seconds_left(iter_num, ntp_iters, sbd_iters, step_seconds, sbd_work):
    """Each stage's remaining steps at its measured seconds per step (step_seconds {stage: s});
    the SBD stage, before it has one, at the NTP step's times sbd_work (sbd_step_work)."""
    ntp_step = step_seconds.get("ntp", 0.0)
    sbd_step = step_seconds.get("sbd", ntp_step * sbd_work)
    return (max(ntp_iters - iter_num, 0) * ntp_step
            + min(ntp_iters + sbd_iters - iter_num, sbd_iters) * sbd_step)


def clock(seconds):
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def adapter_memory(model, fsdp, world_size):
    """The SBD stage's memory before activations, per process: the frozen base in its dtype (fp32
    shards under FSDP) and the adapter's fp32 weights, gradients and AdamW's two moments."""
    n_adapter = sum(p.numel() for name, p in model.named_parameters() if is_adapter(name))
    n_base = sum(p.numel() for p in model.parameters()) - n_adapter
    base_bytes = n_base * (4 if fsdp else next(model.parameters()).element_size())
    return (f"{n_adapter / 1e6:.2f}M parameters, trained in the SBD stage alone; memory before "
            f"activations: base {base_bytes / 1e9 / world_size:.1f} GB + adapter "
            f"{16 * n_adapter / 1e9:.2f} GB per process")
