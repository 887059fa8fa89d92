"""
What a run leaves on disk, and how it is read back: train.py's checkpoints (one dict per file,
written atomically, read with a shape check on every tensor; a block adapter's alone with its base
checked by fingerprint), the γ calibration that evaluate.py writes beside them, and the decoding
settings the two imply.

    model, checkpoint = load_checkpoint("out-sbd-small/ckpt_sbd.pt")
    settings = settings_for(checkpoint, read_calibration("out-sbd-small/ckpt_sbd.pt", checkpoint))

A checkpoint is one dict: model (state dict), model_family ('gpt' or 'llama'), model_args, stage
('ntp' or 'sbd'), config (the run's settings), tokenizer (how to rebuild it), dataset and
data_version (the data it was trained on), mask_id and stop_ids (what decoding needs), iter_num.
A block adapter's SBD checkpoint adds adapter (rank, layers, mask_id), and with adapter_only holds
the adapter's tensors alone with base (the base checkpoint's file and fingerprint);
ckpt_resume.pt adds optimizer.
"""

import hashlib
import json
import os

import torch

from configurator import ConfigError
from model import GPT, GPTConfig, Llama, LlamaConfig, attach_adapter, rope_frequencies
from sampling import ONE_FORWARD
from sbd import split_adapter
from serving.settings import ServingSettings
from tasks.files import check_same_data

# -----------------------------------------------------------------------------
# checkpoints


def save_checkpoint(checkpoint, path):
    """torch.save to a temp file, then rename: a crash mid-write keeps the old checkpoint intact."""
    tmp = f"{path}.tmp"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)  # atomic on POSIX and Windows


def training_checkpoint(state, family, model_args, stage, config, task, iter_num, adapter=None,
                        whole=False):
    """train.py's checkpoint of a stage (the layout above), without the optimizer. adapter:
    {rank, layers, mask_id} of a block adapter, which trains in the SBD stage alone, so the NTP
    stage's checkpoint holds the base alone unless whole (a resume's)."""
    checkpoint = dict(model=state, model_family=family, model_args=model_args, stage=stage,
                      config=config, tokenizer=task.tokenizer_info, dataset=config["dataset"],
                      data_version=task.data_version, mask_id=task.mask_id,
                      stop_ids=list(task.stop_ids), iter_num=iter_num)
    if adapter and stage == "ntp" and not whole:
        checkpoint["model"] = split_adapter(state)[0]
    elif adapter:
        checkpoint["adapter"] = adapter
    return checkpoint


def adapter_alone(checkpoint, base_path):
    """A block adapter's SBD checkpoint with the adapter's tensors alone, and its base's file name
    and fingerprint: load_checkpoint refuses it on other base weights."""
    base = torch.load(base_path, map_location="cpu", mmap=True, weights_only=False)["model"]
    return dict(checkpoint, model=split_adapter(checkpoint["model"])[1],
                base=dict(file=os.path.basename(base_path), fingerprint=fingerprint(base)))


def check_resumable(checkpoint, path, model_args, adapter_rank, adapter_layers, task):
    """Refuse to resume a checkpoint (train.py's ckpt_resume.pt) under another model, block
    adapter or version of the data than the run's own: it would train something else."""
    if checkpoint["model_args"] != model_args:
        raise ConfigError(f"{path} was made with model {checkpoint['model_args']}, this config "
                          f"asks for {model_args}; use the run's original config")
    check_same_data(checkpoint, task, path)
    recorded = checkpoint.get("adapter")  # the block adapter the run trains, if any
    if (recorded or {}).get("rank", 0) != adapter_rank or recorded and (
            recorded["layers"] != adapter_layers):
        raise ConfigError(f"{path} was made with adapter {recorded}, this config asks for "
                          f"adapter_rank={adapter_rank}, adapter_layers={adapter_layers!r}; use "
                          "the run's original config")


def model_from_checkpoint(checkpoint, device):
    """Rebuild the model of a train.py checkpoint ({'model_family', 'model_args', 'model'}, and
    'adapter' {rank, layers, mask_id} for a block adapter's)."""
    family, args = checkpoint["model_family"], checkpoint["model_args"]
    state = {k.removeprefix("_orig_mod.").removeprefix("module."): v
             for k, v in checkpoint["model"].items()}
    adapter = checkpoint.get("adapter")  # absent: the paper's full fine-tune (or NTP)
    with_adapter = (lambda m: attach_adapter(m, adapter["rank"], adapter["layers"],
                                             adapter["mask_id"]) if adapter else m)
    if family == "gpt":
        model = with_adapter(GPT(GPTConfig(**args)))
        check_state_dict(model, state, "checkpoint")
        model.load_state_dict(state, strict=True)
        model = model.to(device)
    else:
        with torch.device("meta"):  # an 8B Llama: no random init, no second copy, checkpoint dtype
            model = with_adapter(Llama(LlamaConfig(**args)))
        check_state_dict(model, state, "checkpoint")
        model.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=True, assign=True)
        model.inv_freq = rope_frequencies(model.config).to(device)  # not persistent: still on meta
    return model


def check_state_dict(model, state, source):
    """A clear error unless state has exactly the model's tensors, each of the model's shape
    (load_state_dict's own is terse). The loaders of pretrained/ check with it too."""
    expected = model.state_dict()  # on the meta device: names and shapes, no memory
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        few = lambda names: ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ConfigError(f"{source}: checkpoint does not match the model. Missing: "
                          f"[{few(missing)}]; unexpected: [{few(unexpected)}]")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ConfigError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, the "
                              f"model expects {tuple(expected[name].shape)} (does the config "
                              "match the weights?)")


def base_weights(path, base):
    """The base model's state dict for an adapter checkpoint at path: base['file'] beside it,
    refused unless its fingerprint is base['fingerprint'] (the weights the adapter was trained
    on)."""
    base_path = os.path.join(os.path.dirname(path), base["file"])
    if not os.path.exists(base_path):
        raise ConfigError(f"{path} holds a block adapter only; its base model {base_path} is "
                          "missing: copy it beside the adapter")
    state = torch.load(base_path, map_location="cpu", mmap=True, weights_only=False)["model"]
    if fingerprint(state) != base["fingerprint"]:
        raise ConfigError(f"{path}: the adapter was trained on other base weights than "
                          f"{base_path} holds now (fingerprints differ); use the base it was "
                          "trained on, or train the adapter again")
    return state


def load_checkpoint(path, device="cpu"):
    """-> (model in eval mode, checkpoint dict). A missing or outdated file is a clear error."""
    if not os.path.exists(path):
        raise ConfigError(f"no checkpoint at {path}: train one first "
                          "(python train.py config/sbd_small.py)")
    try:  # torch.load raises many kinds of error for a file cut short or another program's
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as e:
        raise ConfigError(f"{path} is not a readable checkpoint ({type(e).__name__}): cut short, "
                          "or another program's file; copy or train it again") from None
    if not isinstance(checkpoint, dict) or "model_family" not in checkpoint:
        raise ConfigError(f"{path} is not a checkpoint of train.py (a downloaded model loads "
                          "with init_from)")
    if "stage" not in checkpoint:
        raise ConfigError(f"{path} was written by an older version of train.py: train it again")
    if "base" in checkpoint:  # the adapter alone: its base's weights from the base checkpoint
        checkpoint = {**checkpoint, "model": {**base_weights(path, checkpoint["base"]),
                                              **checkpoint["model"]}}
    model = model_from_checkpoint(checkpoint, device)
    model.eval()
    return model, checkpoint


def fingerprint(state):
    """sha256 of a state dict's tensors, by name: an adapter is only valid on the base it was
    trained on."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous().reshape(-1)
        h.update(name.encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# -----------------------------------------------------------------------------
# settings from a checkpoint and its calibration: sample.py, evaluate.py and the benchmarks build
# their DecodeSettings here, so they read a checkpoint the same way.
#
# From training, every train.py checkpoint holds mask_id, stop_ids, stage ('ntp' or 'sbd') and
# config['ntp_weight'] (0: tuned without the NTP term, so a block's first token cannot come from
# the next-token logits; docs/method.md, The block's first token). From evaluation,
# out_dir/calibration.json holds one entry per block size:
#
#     {"checkpoint": "ckpt_sbd.pt", "data_version": "...",
#      "calibrated_on": "the val split of addition",
#      "k": {"16": {"gamma_low": 0.01, "gamma_high": 0.02, "gamma_exact": 1e9,
#                   "min_draft_prob": 0.0}, "8": {...}},
#      "operating_k": 16, "exact_k": 16}
#
# gamma_low / gamma_high are the largest γ within the accuracy budgets on val (null: none was);
# gamma_exact and min_draft_prob are the exact mode's fastest γ and draft floor; operating_k
# (null: no k has a gamma_low) and exact_k are the block sizes with the fewest forwards. No tool
# rewrites a checkpoint.

CALIBRATION_FILE = "calibration.json"


def calibration_path(checkpoint_path):
    return os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), CALIBRATION_FILE)


def read_calibration(checkpoint_path, checkpoint):
    """The calibration next to a checkpoint, or None if there is none (or it is another run's)."""
    path = calibration_path(checkpoint_path)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        calibration = json.load(f)
    same_run = calibration.get("checkpoint") == os.path.basename(checkpoint_path)
    if not same_run or calibration.get("data_version") != checkpoint.get("data_version"):
        print(f"{path} was written for another checkpoint or data: ignored (run evaluate.py)")
        return None
    return calibration


def write_calibration(checkpoint_path, checkpoint, calibration):
    """Write calibration.json next to the checkpoint -> its path."""
    path = calibration_path(checkpoint_path)
    write_json(path, dict(checkpoint=os.path.basename(checkpoint_path),
                          data_version=checkpoint.get("data_version"), **calibration))
    return path


def write_json(path, record):
    """Write a JSON file atomically: a crash never leaves half a file."""
    with open(f"{path}.tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(f"{path}.tmp", path)


def settings_for(checkpoint, calibration=None, k=None, gamma=None, exact=False, **overrides):
    """ServingSettings (DecodeSettings and serving's fields) for an SBD checkpoint: k and γ as
    given, else as calibrated.

    k: given, else the calibration's operating_k (exact: exact_k), else 16. gamma: given, else the
    calibrated one for that k (exact: gamma_exact, plain: gamma_low); exact SBD's min_draft_prob
    as calibrated unless given. Plain SBD with no γ to use is an error that says what to do.
    overrides: any other field (rule, temperature, top_k, top_p, adaptive, compiled).
    """
    calibration = calibration or {}
    k = k or calibration.get("exact_k" if exact else "operating_k") or 16
    chosen = calibration.get("k", {}).get(str(k), {})
    if exact:
        overrides.setdefault("min_draft_prob", chosen.get("min_draft_prob", 0.0))
    if gamma is None:
        gamma = chosen.get("gamma_exact" if exact else "gamma_low")
    if gamma is None and exact:
        gamma = ONE_FORWARD  # the output is NTP's whatever γ is
    if gamma is None:
        why = ("no γ of this k kept val accuracy within budget" if calibration
               else "the checkpoint has no calibration.json (evaluate.py writes it)")
        raise ConfigError(f"plain SBD at k={k} needs a γ, and {why}: pass one (--gamma=0.01), "
                         "another k, or use the exact mode (--exact=True)")
    config = checkpoint.get("config") or {}  # what the checkpoint was trained with
    # the causal head is trained (the NTP term), or is the NTP model itself (a block adapter)
    first_from_ntp = config.get("ntp_weight", 1.0) > 0 or "adapter" in checkpoint
    token_shift = bool(config.get("token_shift", False))  # absent: a checkpoint of the paper's rule
    if exact and overrides.get("temperature", 0) > 0:
        overrides.setdefault("rule", "left")  # exact sampling needs left-to-right drafts
    return ServingSettings(mask_id=checkpoint["mask_id"], stop_ids=tuple(checkpoint["stop_ids"]),
                           k=k, gamma=gamma, exact=exact, first_from_ntp=first_from_ntp,
                           token_shift=token_shift, **overrides)
