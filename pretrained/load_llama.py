"""
Load Llama 3 checkpoints into model.Llama, from either layout people download:

- Meta's original layout: params.json + consolidated.00.pth (+ tokenizer.model). Our parameter
  names are Meta's and model.apply_rotary uses Meta's interleaved rotary pairs, so this is a
  straight copy.
- Hugging Face's layout: config.json + model.safetensors or model-*.safetensors shards routed by
  model.safetensors.index.json. Names go through a short explicit table, and the wq/wk rows are
  permuted back from HF's rotate_half convention (hf_unpermute below; hf_permute is the inverse).
  Other Llama-architecture models in this layout (SmolLM2, for one) load the same way: config.json
  is judged key by key by what each key means (config_from_hf). So does Qwen-3 (model_type
  "qwen3"): Llama's block plus an RMSNorm over each head's q and k, and its own head_dim.

Either way the model is built on the meta device (no memory, no random init), the weights are
memory-mapped, every tensor's name and shape is checked against the model, and the tensors are
handed over with load_state_dict(strict=True, assign=True), so an 8B checkpoint never sits in
memory twice.

    model, info = load_llama("Meta-Llama-3.1-8B", device="cuda", dtype=torch.bfloat16)

safetensors is read and written here with the standard library + torch (no extra package).
"""

import collections
import dataclasses
import glob
import json
import math
import os
import re
import struct
import sys

import torch

from checkpoint import check_state_dict
from configurator import ConfigError
from model import Llama, LlamaConfig, rope_frequencies

# -----------------------------------------------------------------------------
# safetensors: 8-byte little-endian header size N, N bytes of JSON, then the raw tensor bytes

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
MAX_HEADER_BYTES = 100_000_000  # real headers are a few hundred KB; a bigger one is corrupt


def read_safetensors(path):
    """A .safetensors file -> {name: tensor}, memory-mapped, after checking its layout as the
    reference reader does.

    The tensors are views of a private (copy-on-write) map of the file: pages are read from disk
    when first used, and writing to a tensor never changes the file. A damaged file is a ValueError
    naming the file (and the tensor), never a silent misread. What no format check can see is damage
    that leaves a valid file: changed data bytes, or a dtype or name edited into another valid one
    (safetensors has no checksum).
    """
    if sys.byteorder != "little":  # the format is little-endian, and tensors are views of its bytes
        raise ConfigError(f"{path}: safetensors holds little-endian numbers; this machine is "
                         "big-endian")
    file_size = os.path.getsize(path)
    header, data_start = read_safetensors_header(path, file_size)
    entries = {name: parse_tensor_entry(path, name, entry) for name, entry in header.items()}
    check_tensor_layout(path, entries, file_size - data_start)
    file_bytes = torch.from_file(os.fspath(path), shared=False, size=file_size,
                                 dtype=torch.uint8)  # (file_size,)
    return {name: tensor_from_bytes(path, name, file_bytes, data_start + begin, dtype, shape)
            for name, (dtype, shape, begin, end) in entries.items()}


def read_safetensors_header(path, file_size):
    """-> ({tensor name: header entry}, byte where the tensor data starts).

    Rules: a header size that fits in the file and under 100 MB; the header is UTF-8 JSON of one
    object, no key twice in any object (json.loads would silently keep the last); __metadata__, if
    there, maps strings to strings.
    """
    if file_size < 8:
        raise ConfigError(f"{path}: truncated safetensors file ({file_size} bytes, not even the "
                         "header size)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))  # little-endian u64
        if n > MAX_HEADER_BYTES:
            raise ConfigError(f"{path}: safetensors header claims {n} bytes, over the 100 MB limit "
                             "(corrupt file?)")
        if 8 + n > file_size:
            raise ConfigError(f"{path}: truncated safetensors file (header of {n} bytes, file of "
                             f"{file_size})")
        raw = f.read(n)
    try:  # json.loads ignores the trailing space padding
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, unique_keys': all ValueErrors
        raise ConfigError(f"{path}: safetensors header is not valid JSON in UTF-8 ({e})") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", {})  # free-form strings, nothing we need
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ConfigError(f"{path}: safetensors __metadata__ must map strings to strings, "
                         f"got {metadata!r}")
    return header, 8 + n


def unique_keys(pairs):
    """json object_pairs_hook: a key stated twice is ambiguous (a tensor, or a tensor's dtype), so
    an error."""
    repeated = sorted(k for k, count in collections.Counter(k for k, _ in pairs).items()
                      if count > 1)
    if repeated:
        raise ConfigError(f"key {repeated[0]!r} appears twice in one object")
    return dict(pairs)


def is_count(x):
    return type(x) is int and x >= 0  # not True (== 1 to Python), not 2.0 or 2.5, not -1


def parse_tensor_entry(path, name, entry):
    """One header entry -> (dtype, shape, begin, end): exactly the keys dtype, shape, data_offsets;
    a known dtype; non-negative integer dims and offsets; and end - begin = the bytes that shape and
    dtype need."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ConfigError(f"{where}: a header entry has exactly dtype, shape and data_offsets, "
                         f"got {entry!r}")
    dtype_name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype_name, str) or dtype_name not in SAFETENSORS_DTYPES:
        raise ConfigError(f"{where} has dtype {dtype_name!r}, "
                          f"not one of {list(SAFETENSORS_DTYPES)}")
    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise ConfigError(f"{where} has shape {shape!r}, not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_count(x) for x in offsets):
        raise ConfigError(f"{where} has data_offsets {offsets!r}, not two non-negative integers")
    dtype, (begin, end) = SAFETENSORS_DTYPES[dtype_name], offsets
    n_bytes = math.prod(shape) * dtype.itemsize
    if end - begin != n_bytes:
        raise ConfigError(f"{where} has data_offsets [{begin}, {end}], but shape {shape} of "
                         f"{dtype_name} needs {n_bytes} bytes")
    return dtype, shape, begin, end


def check_tensor_layout(path, entries, data_size):
    """The reference reader's rule: taken in order of their offsets (the JSON's order is free), the
    tensors tile the data section exactly. The first begins at 0, each begins where the previous
    ended (no overlap, no gap), and the last ends at the end of the file. So a header size a few
    bytes short, whose JSON still parses inside its space padding, shifts every tensor and is caught
    here, and so are bytes appended after the last tensor."""
    expected = 0  # where the next tensor must begin, counted from the first data byte
    by_offsets = sorted(entries.items(), key=lambda item: item[1][2:])  # by (begin, end)
    for name, (_, _, begin, end) in by_offsets:
        if end > data_size:
            raise ConfigError(f"{path}: tensor {name!r} ends at data byte {end}, past the end of "
                             f"the file ({data_size} data bytes): the file is truncated or corrupt")
        if begin != expected:
            gap = begin - expected
            problem = ("overlaps the tensor before it" if gap < 0
                       else f"leaves a gap of {gap} bytes before it")
            raise ConfigError(f"{path}: tensor {name!r} begins at data byte {begin}, but the "
                             f"tensors before it end at {expected}: it {problem}")
        expected = end
    if expected != data_size:
        raise ConfigError(f"{path}: the tensors end at data byte {expected}, but the file holds "
                         f"{data_size} data bytes: bytes after the last tensor, or a header size "
                         "that does not match the header")


def tensor_from_bytes(path, name, file_bytes, start, dtype, shape):
    """The tensor whose bytes begin at file byte `start`: a view of file_bytes (uint8 file)."""
    raw = file_bytes[start:start + math.prod(shape) * dtype.itemsize]  # (n_bytes,) uint8
    if start % dtype.itemsize:  # a dtype view needs aligned bytes; the usual writers align
        raw = raw.clone()
    # torch would keep a byte 2 as a True that sums to 2
    if dtype == torch.bool and raw.numel() and int(raw.max()) > 1:
        raise ConfigError(f"{path}: tensor {name!r} is BOOL but holds bytes other than 0 and 1")
    return raw.view(dtype).reshape(shape)


def write_safetensors(tensors, path, metadata=None):
    """Write {name: tensor} as .safetensors; metadata is an optional {str: str} dict.

    Tensors are written largest element size first, after a header padded to 8 bytes, so each one
    starts aligned to its element size (what the reader's zero-copy views need).
    """
    dtype_names = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, offset = {}, 0
    for name in names:
        t = tensors[name]
        if t.dtype not in dtype_names:
            raise ConfigError(f"{path}: cannot write tensor {name!r} of dtype {t.dtype}")
        header[name] = {"dtype": dtype_names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.numel() * t.element_size()]}
        offset += t.numel() * t.element_size()
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in names:  # one tensor at a time: no second copy of the whole checkpoint
            t = tensors[name].detach().cpu().contiguous().reshape(-1)
            f.write(t.view(torch.uint8).numpy().data)


# -----------------------------------------------------------------------------
# rotary permutation between Meta's interleaved pairs and HF's rotate_half pairs


def hf_permute(w, n_heads):
    """Meta -> HF rows of wq (n_heads) or wk (n_kv_heads), as HF's convert_llama_weights_to_hf.py
    does.

    w: (n_heads * head_dim, dim). Within each head, rotary pair i sits in rows (2i, 2i+1) for Meta
    and in rows (i, i + head_dim/2) for HF. E.g. one head of 4 rows: Meta rows [0, 1, 2, 3] -> HF
    order [0, 2, 1, 3].
    """
    rows, dim = w.shape
    pairs = w.reshape(n_heads, rows // n_heads // 2, 2, dim)  # (nh, hd/2, 2, dim): Meta's pairs
    # (nh, 2, hd/2, dim): all first elements, then all second
    return pairs.transpose(1, 2).reshape(rows, dim)


def hf_unpermute(w, n_heads):
    """HF -> Meta rows, the inverse of hf_permute."""
    rows, dim = w.shape
    halves = w.reshape(n_heads, 2, rows // n_heads // 2, dim)  # (nh, 2, hd/2, dim): HF's halves
    return halves.transpose(1, 2).reshape(rows, dim)  # (nh, hd/2, 2, dim): pairs side by side again


# -----------------------------------------------------------------------------
# shared by both loaders


def read_json(path):
    with open(path) as f:
        return json.load(f)


def assign_weights(model, state_dict, device, dtype):
    """Move/cast tensor by tensor (dtype None keeps the checkpoint's), then hand them to the model.
    A tied model's one matrix is converted once and handed over under both names
    (Llama.load_state_dict ties)."""
    tied = model.config.tie_word_embeddings
    if tied:
        del state_dict["output.weight"]  # the loaders made it the embedding matrix (or checked it)
    for name in list(state_dict):
        state_dict[name] = state_dict[name].to(device=device, dtype=dtype)
    if tied:
        state_dict["output.weight"] = state_dict["tok_embeddings.weight"]
    model.load_state_dict(state_dict, strict=True, assign=True)
    # inv_freq is a non-persistent buffer (not in checkpoints), so it is still on the meta device
    model.inv_freq = rope_frequencies(model.config).to(device)
    return model


def same_matrix(a, b):
    return a.shape == b.shape and torch.equal(a, b)


def use_embedding_as_output(state_dict, source, output_name):
    """A tied model's head is its embedding matrix. The file may leave the head out (HF's tied
    checkpoints) or hold an exact copy of it (Meta's Llama 3.2 files); a different matrix means the
    model is not tied after all."""
    emb, out = state_dict.get("tok_embeddings.weight"), state_dict.get("output.weight")
    if emb is None:
        return  # check_state_dict reports the missing embedding
    if out is not None and not same_matrix(out, emb):
        raise ConfigError(f"{source}: the config ties the output head to the embeddings "
                         f"(tie_word_embeddings), but {output_name} in the checkpoint is a "
                         "different matrix")
    state_dict["output.weight"] = emb


# -----------------------------------------------------------------------------
# Meta layout

META_KEYS = {"dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
             "ffn_dim_multiplier", "norm_eps", "rope_theta", "use_scaled_rope",
             "rope_high_freq_factor"}  # same names in LlamaConfig
# newer params.json (Llama 3.2) may state this one
META_RENAMED = {"rope_scaling_factor": "rope_scale_factor"}
META_RUNTIME_KEYS = {"max_batch_size", "max_seq_len"}  # Meta's ModelArgs run settings, not weights
META_DEFAULTS = dict(multiple_of=256, ffn_dim_multiplier=None, norm_eps=1e-5, rope_theta=500000.0,
                     use_scaled_rope=False, rope_scale_factor=8.0)  # Meta's defaults, not our 8B's
# Meta's reference code scales rotary frequencies by 8 for every Llama 3.x, 3.2 included (its
# params.json states no factor); HF's config.json for 3.2 1B/3B says 32, and so do our presets. The
# two differ only in the frequencies whose wavelength is over 2048 tokens.


def config_from_params(params, path):
    """params.json -> LlamaConfig. Every key must be understood: an ignored key could change the
    model (a vision tower, quantization, ...). The folder name is never used."""
    unknown = sorted(set(params) - META_KEYS - set(META_RENAMED) - META_RUNTIME_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; only text-only Llama 3 checkpoints are "
                         "supported")
    for key in ("dim", "n_layers", "n_heads", "vocab_size"):
        if not isinstance(params.get(key), int) or params[key] <= 0:  # Llama 2 writes vocab -1
            raise ConfigError(f"{path}: needs a positive integer {key!r}, got {params.get(key)!r}")
    kw = {**META_DEFAULTS, **{META_RENAMED.get(k, k): v for k, v in params.items()
                              if k not in META_RUNTIME_KEYS}}
    if kw.get("n_kv_heads") is None:  # absent: one K/V head per query head (no grouped queries)
        kw["n_kv_heads"] = params["n_heads"]
    return LlamaConfig(**kw)  # rope low_freq_factor 1 and context 8192 are fixed in Meta's code


def meta_ties_embeddings(state_dict):
    """params.json has no tying flag. Meta's Llama 3.2 1B/3B files hold output.weight as an exact
    copy of tok_embeddings.weight (a converter may leave it out): both mean tied; a different matrix
    means untied."""
    emb, out = state_dict.get("tok_embeddings.weight"), state_dict.get("output.weight")
    return emb is not None and (out is None or same_matrix(out, emb))


def load_meta_checkpoint(ckpt_dir, device="cpu", dtype=None):
    """params.json + consolidated.00.pth -> model.Llama on `device` (dtype None keeps the
    checkpoint's)."""
    params_path = os.path.join(ckpt_dir, "params.json")
    config = config_from_params(read_json(params_path), params_path)
    shards = sorted(glob.glob(os.path.join(ckpt_dir, "consolidated.*.pth")))
    if len(shards) != 1:
        raise ConfigError(f"{ckpt_dir}: found {len(shards)} consolidated.*.pth files; only "
                         "single-shard checkpoints (Llama 3.x 1B/3B/8B) are supported, not the "
                         "model-parallel shards of bigger models")
    state_dict = torch.load(shards[0], map_location="cpu", mmap=True, weights_only=True)
    state_dict.pop("rope.freqs", None)  # a precomputed rotary table in old checkpoints; not ours
    if meta_ties_embeddings(state_dict):
        config = dataclasses.replace(config, tie_word_embeddings=True)
        use_embedding_as_output(state_dict, shards[0], "output.weight")
    with torch.device("meta"):
        model = Llama(config)
    check_state_dict(model, state_dict, shards[0])
    return assign_weights(model, state_dict, device, dtype)


# -----------------------------------------------------------------------------
# Hugging Face layout
#
# config.json's keys are judged by what they mean, not by whether this loader has seen them:
# - a key that changes the forward pass is checked against what model.Llama computes; any other
#   value is an error naming the key and the value, because ignoring it would give wrong numbers
#   without a word;
# - a key known to be metadata (HF_METADATA) is accepted whatever its value;
# - any other key is named on one printed line and ignored (strict_config=True: an error), so that
#   harmless keys from converters and newer transformers versions do not refuse real checkpoints.

HF_CONFIG = {"hidden_size": "dim", "num_hidden_layers": "n_layers",
             "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
             "vocab_size": "vocab_size", "rms_norm_eps": "norm_eps",
             "max_position_embeddings": "max_seq_len"}  # config.json name -> LlamaConfig name
HF_SIZES = [k for k in HF_CONFIG if k != "rms_norm_eps"] + ["intermediate_size"]
HF_ROPE = {"factor": "rope_scale_factor", "low_freq_factor": "rope_low_freq_factor",
           "high_freq_factor": "rope_high_freq_factor",
           "original_max_position_embeddings": "rope_original_context"}
# Keys that change the forward pass -> the values under which model.Llama computes what they say.
# An absent key is transformers' default, the same value.
# model_type -> its causal LM class in transformers; the two families model.Llama computes
HF_FAMILIES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
QWEN3_HEAD_DIM = 128  # transformers' Qwen3Config default when config.json states no head_dim
HF_NEUTRAL = {
    "model_type": list(HF_FAMILIES),  # not qwen3_moe (experts), qwen2 (q/k/v biases), mistral...
    "architectures": [[name] for name in HF_FAMILIES.values()] + [None],
    "hidden_act": ["silu", "swish"],  # two names of one function in transformers
    "attention_bias": [False], "mlp_bias": [False],  # biases on q/k/v/o (as Qwen2) or on the MLP
    # nanotron's flag for the rotary pairs it trained with. transformers ignores it and always pairs
    # dims (i, i + head_dim/2), which false states; true would leave the wq/wk layout in doubt.
    "rope_interleaved": [False],
    "use_sliding_window": [False], "use_mrope": [False],  # local attention; multimodal rotary
    # other families' switches for a norm on q and k (Qwen-3's is implied by its model_type)
    "qk_norm": [False, None], "use_qk_norm": [False, None],
    "qk_layernorm": [False, None], "qk_layer_norms": [False, None],
    "attn_logit_softcapping": [None], "final_logit_softcapping": [None],  # tanh caps (Gemma 2)
    # muP-style scales of the embeddings, residual branches, attention scores and logits
    "embedding_multiplier": [1, None], "scale_emb": [1, None], "residual_multiplier": [1, None],
    "logits_scaling": [1, None], "logit_scale": [1, None],
    "attention_multiplier": [None], "scale_depth": [None],  # replace 1/sqrt(head_dim); residuals
    "num_experts": [None, 0], "num_local_experts": [None, 0], "n_routed_experts": [None, 0],
    "n_shared_experts": [None, 0], "num_experts_per_tok": [None],  # mixture of experts
    "moe_intermediate_size": [None],
    "quantization_config": [None],  # packed low-bit weights with scales, not plain matrices
    "auto_map": [None],  # the checkpoint's own modeling code, which computes what it likes
    "is_encoder_decoder": [False], "add_cross_attention": [False], "pruned_heads": [{}, None],
}
HF_CHECKED = {"intermediate_size", "head_dim", "tie_word_embeddings", "pretraining_tp",
              "sliding_window", "layer_types", "rope_theta", "rope_scaling", "rope_parameters",
              "partial_rotary_factor"}  # checked one by one in hf_math_problems and hf_rope
HF_GENERATION = {"max_length", "min_length", "do_sample", "early_stopping", "num_beams",
                 "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
                 "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
                 "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
                 "output_scores", "return_dict_in_generate", "forced_bos_token_id",
                 "forced_eos_token_id", "remove_invalid_values", "suppress_tokens",
                 "exponential_decay_length_penalty", "begin_suppress_tokens"}  # sampling defaults
HF_METADATA = HF_GENERATION | {
    "_name_or_path", "name_or_path", "_commit_hash", "transformers_version", "is_llama_config",
    "transformers.js_config",  # another runtime's settings (its KV cache dtype)
    "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id",
    "decoder_start_token_id", "tokenizer_class", "prefix",
    "torch_dtype", "dtype", "use_bfloat16",  # the loader keeps the tensors' dtype, or the caller's
    "use_cache", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
    "attn_implementation", "_attn_implementation", "tf_legacy_loss",
    "chunk_size_feed_forward",  # the same MLP computed over chunks of the sequence
    "is_decoder", "tie_encoder_decoder", "cross_attention_hidden_size",  # encoder-decoders only
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task",
    "task_specific_params",  # classification heads and tasks: the causal LM does not use them
    "initializer_range", "attention_dropout",  # training only (model.Llama has no dropout)
    "max_window_layers",  # which layers slide; inert, since use_sliding_window must be false
}
HF_QK_NORM_MAP = {"self_attn.q_norm": "attention.q_norm",  # Qwen-3 only, inside model.layers.N
                  "self_attn.k_norm": "attention.k_norm"}
HF_KEY_MAP = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
              "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
              "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
              "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
              "post_attention_layernorm": "ffn_norm"}  # inside model.layers.N
HF_TOP_KEY_MAP = {"model.embed_tokens.weight": "tok_embeddings.weight",
                  "model.norm.weight": "norm.weight", "lm_head.weight": "output.weight"}


def config_from_hf(cfg, path, strict_config=False):
    """config.json -> LlamaConfig, judging every key by what it means (see above HF_CONFIG).

    A key that would change the forward pass must hold a value model.Llama computes with, else a
    ValueError names the key and its value. Metadata keys are accepted. Keys this loader does not
    know are listed on one printed line and ignored; strict_config=True makes them errors too.
    """
    problems = hf_math_problems(cfg)
    rope, rope_problems = hf_rope(cfg)
    problems += rope_problems
    known = set(HF_CONFIG) | set(HF_NEUTRAL) | HF_CHECKED | HF_METADATA
    unknown = sorted(set(cfg) - known)
    if strict_config:
        problems += [f"unknown key {k!r}" for k in unknown]
    if problems:
        raise ConfigError(f"{path}: unsupported config.json: {'; '.join(problems)}")
    if unknown:
        print(f"{path}: ignored keys this loader does not know: {', '.join(unknown)} "
              "(strict_config=True refuses them)")
    kw = {ours: cfg[k] for k, ours in HF_CONFIG.items()}
    if cfg.get("model_type") == "qwen3":
        kw.update(qk_norm=True, head_size=cfg.get("head_dim", QWEN3_HEAD_DIM))
    # config.json states the FFN width outright (Meta's params.json states the recipe for it)
    return LlamaConfig(**kw, **rope, ffn_hidden_size=cfg["intermediate_size"],
                       tie_word_embeddings=cfg.get("tie_word_embeddings", False))  # HF: untied


def hf_math_problems(cfg):
    """config.json's keys that change the forward pass (all but the rotary ones, hf_rope), each
    against what model.Llama computes -> a list of problems, empty if it computes what they say."""
    problems = [f"no {k!r}" for k in [*HF_CONFIG, "intermediate_size"] if k not in cfg]
    problems += [f"{k}={cfg[k]!r} (need a positive integer)" for k in HF_SIZES
                 if k in cfg and not is_positive(cfg[k])]
    if "rms_norm_eps" in cfg and not is_positive_number(cfg["rms_norm_eps"]):
        problems.append(f"rms_norm_eps={cfg['rms_norm_eps']!r} (need a positive number)")
    problems += [f"{k}={cfg[k]!r} (need {' or '.join(repr(v) for v in ok)})"
                 for k, ok in HF_NEUTRAL.items() if k in cfg and cfg[k] not in ok]
    if cfg.get("tie_word_embeddings", False) not in (True, False):  # model.Llama does both
        problems.append(f"tie_word_embeddings={cfg['tie_word_embeddings']!r} (need true or false)")
    # transformers 4.x split the same matmuls into pretraining_tp slices (the same function, other
    # rounding) and 5.x ignores it, so any positive count computes what model.Llama computes
    if cfg.get("pretraining_tp") is not None and not is_positive(cfg["pretraining_tp"]):
        problems.append(f"pretraining_tp={cfg['pretraining_tp']!r} (need a positive integer)")
    # Qwen2's configs state a window and switch it off with use_sliding_window false
    if cfg.get("sliding_window") is not None and cfg.get("use_sliding_window") is not False:
        problems.append(f"sliding_window={cfg['sliding_window']!r} (model.Llama attends to every "
                        "earlier token: need null)")
    layer_types = cfg.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t != "full_attention" for t in layer_types)):
        problems.append(f"layer_types={layer_types!r} (need every layer 'full_attention')")
    family, arch = cfg.get("model_type", "llama"), cfg.get("architectures")
    if family in HF_FAMILIES and arch is not None and arch != [HF_FAMILIES[family]] \
            and arch in HF_NEUTRAL["architectures"]:  # one family's weights read by another's code
        problems.append(f"architectures={arch!r} with model_type={family!r} (need "
                        f"[{HF_FAMILIES[family]!r}])")
    dim, heads, kv_heads = (cfg.get(k) for k in ("hidden_size", "num_attention_heads",
                                                  "num_key_value_heads"))
    if family == "qwen3":  # Qwen-3 states head_dim on its own; rotary turns pairs of coordinates
        head_dim = cfg.get("head_dim", QWEN3_HEAD_DIM)
        if not is_positive(head_dim) or head_dim % 2:
            problems.append(f"head_dim={head_dim!r} (need a positive even integer)")
        if is_positive(heads) and is_positive(kv_heads) and heads % kv_heads:
            problems.append(f"num_key_value_heads={kv_heads} does not divide "
                            f"num_attention_heads={heads}")
    elif all(is_positive(x) for x in (dim, heads, kv_heads)):
        if dim % heads:
            problems.append(f"hidden_size={dim} is not a multiple of num_attention_heads={heads}")
        elif cfg.get("head_dim") not in (None, dim // heads):  # LlamaConfig derives head_dim
            problems.append(f"head_dim={cfg['head_dim']!r} (need hidden_size / "
                            f"num_attention_heads = {dim // heads})")
        if heads % kv_heads:
            problems.append(f"num_key_value_heads={kv_heads} does not divide "
                            f"num_attention_heads={heads}")
    return problems


def is_positive(x):
    return is_count(x) and x > 0


def is_positive_number(x):
    return type(x) in (int, float) and x > 0  # not True, not "1e-5"


def hf_rope(cfg):
    """config.json's rotary settings, in either form -> (LlamaConfig keywords, problems). Both forms
    give one config.

    transformers 4.x: "rope_theta": 500000.0 and "rope_scaling": null (Llama 3.0) or
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} (3.1 and later). transformers 5.x: one "rope_parameters"
    with rope_theta inside, rope_type "default" (3.0) or "llama3" (the same four keys). A setting
    stated twice must agree ("type" is the old spelling of "rope_type"). partial_rotary_factor may
    sit at the top level too (5.x moves it inside).
    """
    problems, rope = [], {}
    stated = [(k, cfg[k]) for k in ("rope_theta", "partial_rotary_factor") if k in cfg]
    for key in ("rope_scaling", "rope_parameters"):
        if not isinstance(cfg.get(key) or {}, dict):
            return {}, [f"{key}={cfg[key]!r} is not a JSON object"]
        stated += (cfg.get(key) or {}).items()
    for name, value in stated:
        name = "rope_type" if name == "type" else name
        if rope.setdefault(name, value) != value:
            problems.append(f"{name!r} is stated twice, as {rope[name]!r} and {value!r}")
    theta = rope.pop("rope_theta", None)
    if theta is None:
        problems.append("no 'rope_theta'")
    elif not is_positive_number(theta):
        problems.append(f"rope_theta={theta!r} (need a positive number)")
    partial = rope.pop("partial_rotary_factor", 1.0)
    if partial != 1.0:
        problems.append(f"partial_rotary_factor={partial!r} (model.Llama rotates whole heads: "
                        "need 1.0)")
    rope_type = rope.pop("rope_type", "default" if not rope else None)
    if rope_type == "default" and not rope:  # Llama 3.0: plain rotary frequencies
        return dict(rope_theta=theta, use_scaled_rope=False), problems
    if rope_type == "llama3" and set(rope) == set(HF_ROPE):
        scaling = {ours: rope[k] for k, ours in HF_ROPE.items()}
        return dict(rope_theta=theta, use_scaled_rope=True, **scaling), problems
    problems.append(f"rope settings (rope_scaling / rope_parameters) with rope_type {rope_type!r} "
                    f"and {sorted(rope)} are not Llama 3's: rope_type 'default' alone, or "
                    f"'llama3' with exactly {list(HF_ROPE)}")
    return {}, problems


def meta_name(hf_name, qk_norm=False):
    """HF parameter name -> Meta name; names we do not know come back unchanged (then reported).
    q_norm and k_norm are known only to a model with qk_norm: a Llama reports them by HF's name."""
    if hf_name in HF_TOP_KEY_MAP:
        return HF_TOP_KEY_MAP[hf_name]
    key_map = {**HF_KEY_MAP, **HF_QK_NORM_MAP} if qk_norm else HF_KEY_MAP
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", hf_name)
    if m and m.group(2) in key_map:
        return f"layers.{m.group(1)}.{key_map[m.group(2)]}.weight"
    return hf_name


def read_hf_tensors(ckpt_dir):
    """{HF name: tensor} from model.safetensors, or from the shards that
    model.safetensors.index.json names. One layer's tensors can sit in two shards, so every tensor
    is routed through the weight_map."""
    index_path = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    weight_map = read_json(index_path)["weight_map"]  # {tensor name: shard file name}
    shards = {shard: read_safetensors(os.path.join(ckpt_dir, shard))
              for shard in sorted(set(weight_map.values()))}
    for name, shard in weight_map.items():
        if name not in shards[shard]:
            raise ConfigError(f"{index_path}: routes tensor {name!r} to {shard}, which does not "
                             "contain it")
    return {name: shards[shard][name] for name, shard in weight_map.items()}


def load_hf_checkpoint(ckpt_dir, device="cpu", dtype=None, strict_config=False):
    """config.json + safetensors -> model.Llama on `device`, with wq/wk permuted to Meta's rotary
    pairs. strict_config=True: a config.json key this loader does not know is an error, not a
    printed line (config_from_hf)."""
    config_path = os.path.join(ckpt_dir, "config.json")
    config = config_from_hf(read_json(config_path), config_path, strict_config)
    with torch.device("meta"):
        model = Llama(config)
    tensors = read_hf_tensors(ckpt_dir)
    state_dict = {meta_name(name, config.qk_norm): t for name, t in tensors.items()
                  if not name.endswith("rotary_emb.inv_freq")}  # old files kept the rotary table
    if config.tie_word_embeddings:  # usually no lm_head.weight in the files
        use_embedding_as_output(state_dict, ckpt_dir, "lm_head.weight")
    check_state_dict(model, state_dict, ckpt_dir)
    unpermute_qk(state_dict, config)
    return assign_weights(model, state_dict, device, dtype)


def unpermute_qk(state_dict, config):
    """HF's rotate_half rows of every wq and wk -> Meta's pairs, in place. A q_norm or k_norm
    weight (head_dim,) scales each head's coordinates in the same order, so it moves with them."""
    for i in range(config.n_layers):
        for name, n_heads in (("wq", config.n_heads), ("wk", config.n_kv_heads)):
            key = f"layers.{i}.attention.{name}.weight"
            state_dict[key] = hf_unpermute(state_dict[key], n_heads)
        for name in ("q_norm", "k_norm") if config.qk_norm else ():
            key = f"layers.{i}.attention.{name}.weight"
            state_dict[key] = hf_unpermute(state_dict[key][:, None], 1)[:, 0]  # one "head"


# -----------------------------------------------------------------------------
# entry points


def is_meta_dir(d):
    has_weights = bool(glob.glob(os.path.join(d, "consolidated.*.pth")))
    return os.path.exists(os.path.join(d, "params.json")) and has_weights


def is_hf_dir(d):
    has_weights = any(os.path.exists(os.path.join(d, f))
                      for f in ("model.safetensors", "model.safetensors.index.json"))
    return os.path.exists(os.path.join(d, "config.json")) and has_weights


def load_llama(ckpt_dir, device="cpu", dtype=None, strict_config=False):
    """Load whichever layout ckpt_dir holds -> (model, info); info has format, weights_dir,
    tokenizer_path.

    strict_config: False (default) prints one line naming the config.json keys the HF loader does
    not know and ignores them; True refuses them. Keys that change the forward pass are checked
    either way, and Meta's params.json is always strict.
    """
    ckpt_dir = os.fspath(ckpt_dir)
    original = os.path.join(ckpt_dir, "original")  # HF repos keep Meta's files here
    if is_meta_dir(ckpt_dir):
        fmt, weights_dir, model = "meta", ckpt_dir, load_meta_checkpoint(ckpt_dir, device, dtype)
    elif is_hf_dir(ckpt_dir):
        model = load_hf_checkpoint(ckpt_dir, device, dtype, strict_config)
        fmt, weights_dir = "hf", ckpt_dir
    elif is_meta_dir(original):
        fmt, weights_dir, model = "meta", original, load_meta_checkpoint(original, device, dtype)
    else:
        raise ConfigError(f"{ckpt_dir}: no Llama checkpoint found. Expected Meta's files "
                                "(params.json + consolidated.00.pth, here or under original/) or "
                                "Hugging Face's (config.json + model.safetensors, or "
                                "model.safetensors.index.json + its shards)")
    return model, dict(format=fmt, weights_dir=weights_dir, tokenizer_path=find_tokenizer(ckpt_dir))


def find_tokenizer(ckpt_dir):
    """ckpt_dir/tokenizer.model or ckpt_dir/original/tokenizer.model (HF repos of Llama 3), else
    ckpt_dir/tokenizer.json (HF repos without Meta's file: Qwen-3, SmolLM2), else None."""
    paths = [os.path.join(ckpt_dir, "tokenizer.model"),
             os.path.join(ckpt_dir, "original", "tokenizer.model"),
             os.path.join(ckpt_dir, "tokenizer.json")]
    return next((p for p in paths if os.path.exists(p)), None)


@torch.no_grad()
def init_mask_embedding(model, mask_id=128002):
    """Set the SBD mask token's input embedding (<|reserved_special_token_0|>) to the mean of the
    other rows.

    Llama 3 never saw this token in training, so its row is arbitrary; the mean embedding is a
    neutral start for fine-tuning. An untied model's output row is left alone; a tied model's
    (Llama 3.2 1B/3B) is the same row, so it changes too. Either way no decoder emits the token:
    every sampler in sbd.py sets its logit to -inf (sbd.suppress_mask), and training never uses it
    as a label.
    """
    emb = model.tok_embeddings.weight  # (vocab, dim)
    vocab = emb.size(0)
    if not 0 <= mask_id < vocab:
        raise ConfigError(f"mask_id {mask_id} is outside the vocabulary of {vocab} tokens")
    total = emb.sum(0, dtype=torch.float32)  # (dim,) in fp32: bf16 sums of 128k rows lose digits
    emb[mask_id] = ((total - emb[mask_id].float()) / (vocab - 1)).to(emb.dtype)
    return model


def with_mask_row(model, init_from, mask_id):
    """The model loaded from init_from, ready to fine-tune: the mask token's row set by
    init_mask_embedding, unless init_from is a run's ckpt_ntp.pt, which keeps the row it trained
    with, so that a block adapter trained on it has that NTP baseline, unchanged, as its base."""
    return model if str(init_from).endswith(".pt") else init_mask_embedding(model, mask_id)
