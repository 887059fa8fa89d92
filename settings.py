"""
How a trained model is decoded: the settings record (sampling.DecodeSettings) built from a
checkpoint and the calibration that evaluate.py writes next to it, and one call that decodes with
it. sample.py, bench.py and evaluate.py all go through here, so they read a checkpoint the same way.

What decoding needs from training is in every train.py checkpoint: mask_id, stop_ids, stage ('ntp'
or 'sbd') and config['ntp_weight'] (0: tuned without the NTP term, so a block's first token cannot
come from the next-token logits; docs/method.md, The block's first token). What decoding needs from
evaluation is in out_dir/calibration.json, one entry per block size:

    {"checkpoint": "ckpt_sbd.pt", "data_version": "...",
     "calibrated_on": "the val split of addition",
     "k": {"16": {"gamma_low": 0.01, "gamma_high": 0.02, "gamma_exact": 1e9}, "8": {...}},
     "operating_k": 16, "exact_k": 16}

gamma_low / gamma_high are the largest γ within the accuracy budgets on val (null: none was);
gamma_exact is the exact mode's fastest γ; operating_k (null: no k has a gamma_low) and exact_k are
the block sizes with the fewest forwards. No tool rewrites a checkpoint.
"""

import json
import os

from configurator import ConfigError
from exact import exact_generate
from generate import ntp_generate, sbd_generate
from sampling import DecodeSettings

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
    """Write calibration.json next to the checkpoint, atomically (a crash never leaves half)."""
    path = calibration_path(checkpoint_path)
    record = dict(checkpoint=os.path.basename(checkpoint_path),
                  data_version=checkpoint.get("data_version"), **calibration)
    with open(f"{path}.tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(f"{path}.tmp", path)
    return path


def settings_for(checkpoint, calibration=None, k=None, gamma=None, exact=False, **overrides):
    """DecodeSettings for an SBD checkpoint: k and γ as given, else as calibrated.

    k: given, else the calibration's operating_k (exact: exact_k), else 16. gamma: given, else the
    calibrated one for that k (exact: gamma_exact, plain: gamma_low). Plain SBD with no γ to use
    is an error that says what to do. overrides: any other DecodeSettings field (rule,
    temperature, top_k, top_p, adaptive).
    """
    calibration = calibration or {}
    k = k or calibration.get("exact_k" if exact else "operating_k") or 16
    if gamma is None:
        chosen = calibration.get("k", {}).get(str(k), {})
        gamma = chosen.get("gamma_exact" if exact else "gamma_low")
    if gamma is None and exact:
        gamma = 1e9  # the output is NTP's whatever γ is: reveal every masked slot at once
    if gamma is None:
        why = ("no γ of this k kept val accuracy within budget" if calibration
               else "the checkpoint has no calibration.json (evaluate.py writes it)")
        raise ConfigError(f"plain SBD at k={k} needs a γ, and {why}: pass one (--gamma=0.01), "
                         "another k, or use the exact mode (--exact=True)")
    first_from_ntp = (checkpoint.get("config") or {}).get("ntp_weight", 1.0) > 0
    if exact and overrides.get("temperature", 0) > 0:
        overrides.setdefault("rule", "left")  # exact sampling needs left-to-right drafts
    return DecodeSettings(mask_id=checkpoint["mask_id"], stop_ids=tuple(checkpoint["stop_ids"]),
                          k=k, gamma=gamma, exact=exact, first_from_ntp=first_from_ntp,
                          **overrides)


def decode(model, prompt, settings, max_new_tokens, ntp=False, generator=None,
           record_steps=False):
    """Decode a batch of prompts -> (token lists, DecodeStats).

    ntp=True: next-token decoding with the settings' stop tokens, mask token and sampling (the
    baseline). Otherwise SBD as the settings say: exact_generate if settings.exact, else
    sbd_generate.
    """
    s = settings
    if ntp:
        return ntp_generate(model, prompt, max_new_tokens, s.stop_ids, s.temperature, s.top_k,
                            generator, s.mask_id, s.top_p)
    run = exact_generate if s.exact else sbd_generate
    return run(model, prompt, s, max_new_tokens, generator, record_steps)
