"""Checkpoint I/O tests. A tiny random Llama is written in Meta's and HF's layouts (the HF names and files are
made here by hand, as HF's converter would) and must load back to the same parameters and logits; safetensors
files are checked against bytes built by hand; broken files must fail with errors naming the file and tensor."""

import dataclasses
import json
import struct

import pytest
import torch

from load_llama import (hf_permute, hf_unpermute, init_mask_embedding, load_hf_checkpoint, load_llama,
                        load_meta_checkpoint, read_safetensors, write_safetensors)
from model import LLAMA_PRESETS, Llama, LlamaConfig, apply_rotary, rope_frequencies, rotary_cos_sin

# llama-tiny's params.json, written out by hand. Meta's params.json has no field for the rope's original
# context (Meta's code fixes it at 8192), so the Meta-layout reference model uses 8192, not the preset's 64.
TINY_PARAMS = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 320, "multiple_of": 32,
               "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5, "rope_theta": 500000.0, "use_scaled_rope": True}


def tiny_config_json(original_context):
    """llama-tiny's config.json as HF writes it; FFN width int(1.3 * int(8 * 64 / 3)) = 221 -> 224."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 224, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 320, "max_position_embeddings": 512,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": original_context, "rope_type": "llama3"},
            "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "torch_dtype": "float32", "bos_token_id": 128000, "eos_token_id": 128001, "use_cache": True}


HF_LAYER_NAMES = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
                  "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
                  "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
                  "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
HF_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}


def tiny_llama(original_context=8192):
    """llama-tiny (4 query / 2 K-V heads, Llama 3.1 rope scaling) with every weight random, norms included."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**LLAMA_PRESETS["llama-tiny"], "rope_original_context": original_context}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms start at exactly 1; make a swapped norm show
    return model.eval()


def save_meta(model, directory, params=TINY_PARAMS, state_dict=None):
    directory.mkdir(parents=True)
    (directory / "params.json").write_text(json.dumps(params))
    state_dict = dict(model.state_dict()) if state_dict is None else state_dict
    torch.save({**state_dict, "rope.freqs": torch.randn(8)}, directory / "consolidated.00.pth")


def to_hf(model):
    """Meta state dict -> HF names, with q/k rows permuted as HF's converter does."""
    c, out = model.config, {}
    for name, w in model.state_dict().items():
        if name in HF_TOP_NAMES:
            out[HF_TOP_NAMES[name]] = w
            continue
        parts = name.split(".")  # layers.N.<module>.weight
        module = ".".join(parts[2:-1])
        if module == "attention.wq":
            w = hf_permute(w, c.n_heads)
        if module == "attention.wk":
            w = hf_permute(w, c.n_kv_heads)
        out[f"model.layers.{parts[1]}.{HF_LAYER_NAMES[module]}.weight"] = w
    return out


def save_hf(tensors, directory, config_json, sharded=True):
    """Two shards routed by model.safetensors.index.json (splitting layer 0 between them), or one file."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config_json))
    if not sharded:
        return write_safetensors(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:7], "model-00002-of-00002.safetensors": names[7:]}
    assert "model.layers.0.mlp.up_proj.weight" in names[:7] and "model.layers.0.self_attn.q_proj.weight" in names[7:]
    for shard, shard_names in shards.items():
        write_safetensors({n: tensors[n] for n in shard_names}, directory / shard)
    index = {"metadata": {"total_size": 0}, "weight_map": {n: s for s, ns in shards.items() for n in ns}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def assert_same_model(loaded, ref):
    ref_sd, got_sd = ref.state_dict(), loaded.state_dict()
    assert got_sd.keys() == ref_sd.keys()
    for name in ref_sd:
        assert torch.equal(got_sd[name], ref_sd[name]), name
    assert torch.equal(loaded.inv_freq, ref.inv_freq)
    assert all(p.requires_grad and p.device.type == "cpu" for p in loaded.parameters())
    idx = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(1))
    for pos in (None, torch.arange(480, 496)):  # late positions, where the scaled low frequencies matter
        with torch.no_grad():
            (got, _), (want, _) = loaded(idx, pos=pos), ref(idx, pos=pos)
        assert (got - want).abs().max() <= 1e-5


# -----------------------------------------------------------------------------
# rotary permutation


def test_hf_permute_by_hand():
    w = torch.arange(8.0).view(8, 1)  # 2 heads of head_dim 4; Meta pairs (0,1),(2,3) per head
    assert hf_permute(w, 2).flatten().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]  # HF: first elements, then second
    assert torch.equal(hf_unpermute(hf_permute(w, 2), 2), w)


def rotate_half_rope(x, pos, inv_freq):
    """HF's rotary convention, written out independently: pair i is (x[i], x[i + hd/2])."""
    angles = pos[:, None].float() * inv_freq  # (T, hd/2)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (T, hd)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def test_hf_permute_turns_meta_rotary_into_rotate_half():
    config = LlamaConfig(**LLAMA_PRESETS["llama-tiny"])
    nh, hd, T = config.n_heads, config.head_dim, 5
    wq, x, pos = torch.randn(nh * hd, config.dim), torch.randn(T, config.dim), torch.arange(100, 100 + T)
    inv_freq = rope_frequencies(config)  # (hd/2,)
    cos, sin = rotary_cos_sin(pos, inv_freq)
    q_meta = apply_rotary((x @ wq.T).view(1, T, nh, hd).transpose(1, 2), cos, sin)[0]  # (nh, T, hd)
    q_hf = rotate_half_rope((x @ hf_permute(wq, nh).T).view(T, nh, hd).transpose(0, 1), pos, inv_freq)
    meta_dim_of = [2 * j for j in range(hd // 2)] + [2 * j + 1 for j in range(hd // 2)]  # HF dim -> Meta dim
    assert torch.allclose(q_hf, q_meta[..., meta_dim_of], atol=1e-5)  # same vector, dims reordered


# -----------------------------------------------------------------------------
# loading


def test_meta_layout_loads_exactly(tmp_path):
    ref = tiny_llama()
    save_meta(ref, tmp_path / "meta")
    loaded = load_meta_checkpoint(tmp_path / "meta")
    assert_same_model(loaded, ref)
    # params.json cannot state max_seq_len (Meta passes it at run time): everything else must round-trip
    assert dataclasses.replace(loaded.config, max_seq_len=ref.config.max_seq_len) == ref.config


def test_hf_sharded_layout_loads_exactly(tmp_path):
    ref = tiny_llama(original_context=64)  # exactly the preset: config.json states every rope field
    save_hf(to_hf(ref), tmp_path / "hf", tiny_config_json(64))
    loaded = load_hf_checkpoint(tmp_path / "hf")
    assert_same_model(loaded, ref)
    assert loaded.config.ffn_hidden == 224 and loaded.config.max_seq_len == 512
    assert loaded.config.rope_original_context == 64 and loaded.config.n_kv_heads == 2


def test_hf_bf16_single_file(tmp_path):
    ref = tiny_llama()
    save_hf({k: v.bfloat16() for k, v in to_hf(ref).items()}, tmp_path / "hf", tiny_config_json(8192), sharded=False)
    as_stored = load_hf_checkpoint(tmp_path / "hf")
    as_fp32 = load_hf_checkpoint(tmp_path / "hf", dtype=torch.float32)
    for name, want in ref.state_dict().items():
        assert as_stored.state_dict()[name].dtype == torch.bfloat16
        assert torch.equal(as_stored.state_dict()[name], want.bfloat16()), name
        assert torch.equal(as_fp32.state_dict()[name], want.bfloat16().float()), name


def test_load_llama_detects_layouts(tmp_path):
    ref = tiny_llama()
    repo = tmp_path / "repo"  # an HF repo: HF files on top, Meta's under original/
    save_hf(to_hf(ref), repo, tiny_config_json(8192))
    save_meta(ref, repo / "original")
    (repo / "original" / "tokenizer.model").write_text("")
    hf_model, info = load_llama(repo)
    assert info["format"] == "hf" and info["tokenizer_path"] == str(repo / "original" / "tokenizer.model")
    save_meta(ref, tmp_path / "only_original" / "original")
    meta_model, info = load_llama(tmp_path / "only_original")
    assert info["format"] == "meta" and info["weights_dir"] == str(tmp_path / "only_original" / "original")
    assert_same_model(hf_model, ref)
    assert_same_model(meta_model, hf_model)  # both layouts give the same parameters and logits
    (tmp_path / "empty").mkdir()
    for missing in (tmp_path / "empty", tmp_path / "nowhere"):
        with pytest.raises(FileNotFoundError, match="params.json.*config.json"):
            load_llama(missing)


def test_init_mask_embedding():
    model, m = tiny_llama(), 300
    emb, out = model.tok_embeddings.weight.detach().clone(), model.output.weight.detach().clone()
    init_mask_embedding(model, mask_id=m)
    new = model.tok_embeddings.weight
    assert torch.allclose(new[m], torch.cat([emb[:m], emb[m + 1:]]).mean(0), atol=1e-6)
    assert torch.equal(new[:m], emb[:m]) and torch.equal(new[m + 1:], emb[m + 1:])
    assert torch.equal(model.output.weight, out)
    with pytest.raises(ValueError):
        init_mask_embedding(model, mask_id=320)


# -----------------------------------------------------------------------------
# broken checkpoints


def expect_error(fn, *phrases, error=ValueError):
    with pytest.raises(error) as e:
        fn()
    for phrase in phrases:
        assert str(phrase) in str(e.value), (phrase, str(e.value))


def test_meta_checkpoint_errors(tmp_path):
    ref = tiny_llama()
    good = dict(ref.state_dict())
    cases = {"shape": {**good, "output.weight": torch.randn(319, 64)},
             "missing": {k: v for k, v in good.items() if k != "layers.1.ffn_norm.weight"},
             "unexpected": {**good, "layers.0.attention.wq.bias": torch.randn(64)}}
    names = {"shape": "output.weight", "missing": "layers.1.ffn_norm.weight", "unexpected": "layers.0.attention.wq.bias"}
    for case, state_dict in cases.items():
        save_meta(ref, tmp_path / case, state_dict=state_dict)
        expect_error(lambda: load_meta_checkpoint(tmp_path / case), names[case], tmp_path / case)
    save_meta(ref, tmp_path / "vision", params={**TINY_PARAMS, "vision_chunk_size": 448})
    expect_error(lambda: load_meta_checkpoint(tmp_path / "vision"), "vision_chunk_size", "params.json")
    save_meta(ref, tmp_path / "two")
    torch.save(good, tmp_path / "two" / "consolidated.01.pth")
    expect_error(lambda: load_meta_checkpoint(tmp_path / "two"), "single-shard")


def test_hf_checkpoint_errors(tmp_path):
    ref = tiny_llama()
    good = to_hf(ref)
    save_hf({**good, "model.layers.1.self_attn.k_proj.weight": torch.randn(16, 64)}, tmp_path / "shape",
            tiny_config_json(8192))
    expect_error(lambda: load_hf_checkpoint(tmp_path / "shape"), "layers.1.attention.wk.weight", "(16, 64)")
    save_hf({**good, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, tmp_path / "extra",
            tiny_config_json(8192), sharded=False)
    expect_error(lambda: load_hf_checkpoint(tmp_path / "extra"), "model.layers.0.self_attn.q_norm.weight")
    for case, change in {"head_dim": {"head_dim": 32}, "tied": {"tie_word_embeddings": True},
                         "rope": {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "unknown": {"sliding_window": 8}}.items():
        save_hf(good, tmp_path / case, {**tiny_config_json(8192), **change}, sharded=False)
        expect_error(lambda: load_hf_checkpoint(tmp_path / case), "config.json", next(iter(change)))


# -----------------------------------------------------------------------------
# safetensors


def test_safetensors_round_trip(tmp_path):
    tensors = {"bf16": torch.randn(3, 4).bfloat16(), "f16": torch.randn(5).half(), "f32": torch.randn(2, 3, 4),
               "f64": torch.randn(3).double(), "i64": torch.arange(-3, 4), "i32": torch.arange(6, dtype=torch.int32),
               "i16": torch.tensor([-7, 7], dtype=torch.int16), "i8": torch.tensor([-128, 127], dtype=torch.int8),
               "u8": torch.tensor([0, 255], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
               "scalar": torch.tensor(3.5), "scalar_bf16": torch.tensor(-2.0).bfloat16(), "empty": torch.zeros(0, 3)}
    write_safetensors(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    loaded = read_safetensors(tmp_path / "t.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape and torch.equal(loaded[name], t), name


def raw_file(path, header, data, pad=b""):
    """A safetensors file built by hand: u64 little-endian header size, JSON header, data."""
    raw = (header if isinstance(header, bytes) else json.dumps(header).encode()) + pad
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_reads_hand_built_bytes(tmp_path):
    header = {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
              "b": {"dtype": "F32", "shape": [], "data_offsets": [6, 10]}, "__metadata__": {"format": "pt"}}
    data = struct.pack("<3H", 0x3F80, 0x4000, 0xC040) + struct.pack("<f", 2.5)  # bf16 1, 2, -3; f32 2.5
    loaded = read_safetensors(raw_file(tmp_path / "h.safetensors", header, data, pad=b"   "))
    assert loaded["a"].dtype == torch.bfloat16 and loaded["a"].tolist() == [1.0, 2.0, -3.0]
    assert loaded["b"].shape == () and loaded["b"].item() == 2.5  # also read from an unaligned offset
    write_safetensors({"x": torch.tensor([1.0, -2.0]).bfloat16()}, tmp_path / "w.safetensors")
    raw = (tmp_path / "w.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and json.loads(raw[8:8 + n])["x"] == {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}
    assert raw[8 + n:] == struct.pack("<2H", 0x3F80, 0xC000)


def test_safetensors_errors(tmp_path):
    f32 = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    cases = {
        "truncated": (raw_file(tmp_path / "truncated.st", f32, b"\0" * 5), ["'x'", "past the end"]),
        "offsets": (raw_file(tmp_path / "offsets.st", {"x": {**f32["x"], "data_offsets": [8, 16]}}, b"\0" * 8),
                    ["'x'", "past the end"]),
        "count": (raw_file(tmp_path / "count.st", {"x": {**f32["x"], "shape": [3]}}, b"\0" * 12), ["'x'", "12 bytes"]),
        "json": (raw_file(tmp_path / "json.st", b"{oops", b""), ["not valid JSON"]),
        "dtype": (raw_file(tmp_path / "dtype.st", {"x": {**f32["x"], "dtype": "Q4"}}, b"\0" * 8), ["'x'", "'Q4'"]),
    }
    (tmp_path / "huge.st").write_bytes(struct.pack("<Q", 200_000_000) + b"{}")
    (tmp_path / "short_header.st").write_bytes(struct.pack("<Q", 64) + b"{}")
    (tmp_path / "tiny.st").write_bytes(b"\1\2\3")
    cases.update(huge=(tmp_path / "huge.st", ["100 MB"]), short_header=(tmp_path / "short_header.st", ["truncated"]),
                 tiny=(tmp_path / "tiny.st", ["truncated"]))
    for path, phrases in cases.values():
        expect_error(lambda: read_safetensors(path), path, *phrases)
