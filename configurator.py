"""
Configuration the nanoGPT way, minus its silent typos.

A script defines its settings as module-level globals, then calls

    config = configure(globals(), sys.argv[1:])

Each argument is either a config file (config/sbd_small.py, plain Python assignments) or
--key=value. Both override the globals in order. Unlike nanoGPT's configurator:
- an unknown key (in a file or on the command line) is an error naming it and the closest known one;
- a value must keep its setting's type, except that an int may stand for a float and a None default
  takes anything;
- the resolved configuration is printed and returned, so the script can save it in its checkpoints.
"""

import ast
import difflib
import os
import sys
import types

CONFIG_TYPES = (int, float, bool, str, tuple, list, type(None))


class ConfigError(ValueError):
    """Bad input from the user: a setting, a file, a device. The entry points print its message on
    one line and exit with status 2; any other exception is a bug and keeps its traceback."""


def require(ok, message):
    """A setting out of its range is a ConfigError that says what is allowed."""
    if not ok:
        raise ConfigError(message)


def report_errors(kind, error, traceback):
    """sys.excepthook of every entry point (configure installs it)."""
    if issubclass(kind, ConfigError):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.__excepthook__(kind, error, traceback)


def bf16_supported(device):
    """Whether the device computes bfloat16 natively: a CUDA GPU that says so, or a CPU with
    AVX512-BF16 or AMX (Linux reports them in /proc/cpuinfo). Elsewhere bf16 would be emulated and
    slower than fp32."""
    import torch

    kind = str(device).split(":")[0]
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind != "cpu" or not os.path.exists("/proc/cpuinfo"):
        return False
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype, device):
    """'auto' -> 'bfloat16' where the device computes it natively, else 'float32'."""
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError("dtype must be 'auto', 'float32', 'bfloat16' or 'float16', "
                          f"got {dtype!r}")
    if dtype == "auto":
        return "bfloat16" if bf16_supported(device) else "float32"
    return dtype


def pick_device(name=""):
    """'' -> the best device there is (cuda -> mps -> cpu); a named one must exist."""
    import torch  # here, so that configuring a script does not import torch

    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if not name:
        return "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    kind = name.split(":")[0]
    there = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": mps}.get(kind)
    if there is None:
        raise ConfigError(f"unknown device {name!r}: use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if not there:
        raise ConfigError(f"device {name!r} is not available on this machine (torch "
                          f"{torch.__version__}): leave device unset to pick the best one there is")
    if kind == "cuda" and ":" in name and int(name.split(":")[1]) >= torch.cuda.device_count():
        raise ConfigError(f"device {name!r}: this machine has {torch.cuda.device_count()} GPUs")
    return name


def config_keys(script_globals):
    """The settings of a script: its public module-level globals of a plain type. UPPER_CASE names
    are constants of the module (e.g. evaluate.GAMMA_GRID), not settings."""
    return [k for k, v in script_globals.items() if not k.startswith("_") and not k.isupper()
            and isinstance(v, CONFIG_TYPES) and not isinstance(v, types.ModuleType)]


def check_value(key, value, known, where):
    """Raise ConfigError unless key is a known setting and value fits its type; return the value."""
    if key not in known:
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown config key {key!r} in {where}{hint} "
                          f"(known keys: {', '.join(sorted(known))})")
    default = known[key]
    if default is None or type(value) is type(default):
        return value
    if isinstance(default, float) and type(value) is int:  # --lr=1 means 1.0
        return float(value)
    if isinstance(default, (tuple, list)) and isinstance(value, (tuple, list)):
        return type(default)(value)
    raise ConfigError(f"config key {key!r} in {where} must be {type(default).__name__}, "
                      f"got {type(value).__name__} {value!r}")


def parse_value(text):
    """'3e-4' -> 3e-4, 'True' -> True, '(2, 16)' -> (2, 16); anything else stays a string."""
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError):
        return text


def configure(script_globals, argv, print_config=True):
    """Apply config files and --key=value overrides to a script's settings -> the resolved config.
    Installs report_errors, so that bad input ends in one line instead of a traceback."""
    sys.excepthook = report_errors
    known = {k: script_globals[k] for k in config_keys(script_globals)}
    updates = {}
    for arg in argv:
        if not arg.startswith("--"):  # a config file: run it, keep what it assigned
            try:
                source = open(arg).read()
            except OSError as e:
                raise ConfigError(f"cannot read config file {arg!r}: {e.strerror}") from None
            namespace = {}
            exec(compile(source, arg, "exec"), namespace)
            for key, value in namespace.items():
                if key.startswith("_") or isinstance(value, types.ModuleType):
                    continue
                updates[key] = check_value(key, value, known, f"config file {arg}")
        else:
            key, sep, text = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"command-line override {arg!r} must look like --key=value")
            updates[key] = check_value(key, parse_value(text), known, "the command line")
    script_globals.update(updates)
    config = {k: script_globals[k] for k in known}
    if print_config:
        print("config: " + ", ".join(f"{k}={v!r}" for k, v in config.items()))
    return config


def check_training_settings(c):
    """train.py's settings (the dict configure returned), checked together before anything runs:
    a ConfigError that says what is allowed."""
    require(not (c["dataset"].endswith(".jsonl") and c["init_from"] == "scratch"),
            f"dataset={c['dataset']!r}: a .jsonl dataset fine-tunes a Llama-family model; set "
            "init_from to its directory, a .gguf file or 'smollm2'")
    require(c["sbd_starts_from"] in ("ntp", "init"),
            f"sbd_starts_from must be 'ntp' or 'init', got {c['sbd_starts_from']!r}")
    require(c["attention"] in ("sdpa", "flex"),
            f"attention must be 'sdpa' or 'flex', got {c['attention']!r}")
    require(1 <= c["k_min"] <= c["k_max"], "block sizes need 1 <= k_min <= k_max, got "
            f"k_min={c['k_min']}, k_max={c['k_max']}")
    require(c["batch_size"] >= 1 and c["sbd_batch_size"] >= 0
            and c["gradient_accumulation_steps"] >= 1,
            "batch_size and gradient_accumulation_steps must be >= 1 and sbd_batch_size >= 0 "
            f"(0 = batch_size), got {c['batch_size']}, {c['gradient_accumulation_steps']}, "
            f"{c['sbd_batch_size']}")
    require(c["block_phase"] in ("answer", "random", "zero"),
            f"block_phase must be 'answer', 'random' or 'zero', got {c['block_phase']!r}")
    require(min(c["ntp_weight"], c["ntp_iters"], c["sbd_iters"]) >= 0,
            "ntp_weight, ntp_iters and sbd_iters must be >= 0")
    require(not (c["token_shift"] or c["complementary_masks"] or c["all_masked_rows"])
            or c["sbd_iters"] > 0, "token_shift, complementary_masks and all_masked_rows set how "
            "SBD trains: they need sbd_iters > 0")
    require(0 <= c["all_masked_rows"] <= 1,
            f"all_masked_rows is a fraction of rows in [0, 1], got {c['all_masked_rows']}")
    rank = c["adapter_rank"]
    require(rank >= 0 and not (rank and (c["sbd_iters"] == 0 or c["sbd_starts_from"] == "init"
                                         and c["ntp_iters"])),
            f"adapter_rank={rank}: a block adapter (rank >= 1) trains in the SBD stage on top of "
            "the NTP model: it needs sbd_iters > 0 and sbd_starts_from='ntp'; adapter_rank=0 "
            "fine-tunes every weight")
    require(not c["adapter_only"] or (rank and c["ntp_iters"]),
            "adapter_only saves a block adapter apart from its base, ckpt_ntp.pt: it needs "
            "adapter_rank >= 1 and ntp_iters > 0")
    require(not c["token_shift"] or (c["k_min"] >= 2 and (c["ntp_weight"] > 0 or rank)),
            "token_shift reads a block's first token from the causal head and the rest from the "
            f"block: use k_min >= 2 (got {c['k_min']}) and keep the NTP term (got "
            f"ntp_weight={c['ntp_weight']})")


def check_decode_settings(s, rules):
    """A sampling.DecodeSettings checked whole (rules: the reveal rules' names): a ConfigError that
    says what is allowed."""
    require(s.k >= 1, f"block size k must be at least 1, got {s.k}")
    require(s.gamma >= 0, f"gamma must be >= 0 (0 reveals one token per forward), got {s.gamma}")
    require(s.rule in rules, f"unknown reveal rule {s.rule!r}; choose one of {rules}")
    require(s.mask_id not in s.stop_ids, f"mask id {s.mask_id} cannot also be a stop token")
    require(s.temperature >= 0, f"temperature must be >= 0 (0: greedy), got {s.temperature}")
    require(s.top_k is None or s.top_k >= 1,
            f"top_k must be at least 1 (None: all tokens), got {s.top_k}")
    require(s.top_p is None or 0 < s.top_p <= 1, f"top_p must be in (0, 1], got {s.top_p}")
    require(s.first_from_ntp or not s.token_shift,
            "token_shift reads a block's first position from the causal logits, so it needs "
            "first_from_ntp (a model trained with the NTP term)")
    require(not (s.exact and s.temperature > 0 and s.rule != "left"),
            "exact sampling (temperature > 0) needs drafts revealed left to right: rule='left' "
            "(docs/method.md, Exact sampling)")


def check_serving_settings(s):
    """serving.settings.ServingSettings' own fields, checked: a ConfigError that says what is
    allowed."""
    require(0 <= s.min_draft_prob <= 1,
            f"min_draft_prob is a probability in [0, 1], got {s.min_draft_prob}")
    require(s.exact or not s.min_draft_prob,
            "min_draft_prob cuts the drafts exact SBD checks: it needs exact=True")


def check_sample_settings(c, weights):
    """sample.py's settings (the dict configure returned; weights: serving's weight formats),
    checked before anything loads: a ConfigError that says what is allowed."""
    require(c["mode"] in ("sbd", "ntp", "both"),
            f"mode must be 'sbd', 'ntp' or 'both', got {c['mode']!r}")
    require(c["gamma"] >= 0 or c["gamma"] == -1,
            f"gamma must be >= 0, or -1 for the calibrated one; got {c['gamma']}")
    require(c["k"] >= 0, f"k must be >= 1, or 0 for the calibrated one; got {c['k']}")
    require(c["min_draft_prob"] == -1 or 0 <= c["min_draft_prob"] <= 1 and c["exact"],
            "min_draft_prob: a probability with --exact=True, or -1 for the calibrated one; got "
            f"{c['min_draft_prob']}")
    require(c["temperature"] >= 0, f"temperature must be >= 0 (0: greedy), got {c['temperature']}")
    require(c["top_k"] >= 0, f"top_k must be >= 1, or 0 for all tokens; got {c['top_k']}")
    require(0 < c["top_p"] <= 1, f"top_p must be in (0, 1], got {c['top_p']}")
    require(c["compile"] in (True, False, None),
            f"compile must be True or False, got {c['compile']!r}")
    require(c["weights"] in (*weights, "auto"),
            f"weights must be one of {weights} or 'auto': {c['weights']!r}")
    require(c["quantized_rows"] >= 1, f"quantized_rows must be >= 1, got {c['quantized_rows']}")
    require(c["max_new_tokens"] >= 1 and c["num_samples"] >= 1,
            "max_new_tokens and num_samples must be >= 1, got "
            f"{c['max_new_tokens']} and {c['num_samples']}")
