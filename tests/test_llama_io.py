"""Checkpoint I/O tests. A tiny random Llama is written in Meta's and HF's layouts (the HF names and
files are made here by hand, as HF's converter would) and must load back to the same parameters and
logits; so must config.json in transformers 5.x's form, and a tied-embedding Llama (3.2 1B/3B),
which must stay tied through loading, checkpoints, .to() and init_mask_embedding. The presets'
parameter counts are counted by hand. safetensors files are checked against bytes built by hand;
broken or damaged files must fail with errors naming the file and tensor, and a fuzz test checks
that no damage to a file's layout ever loads different numbers."""

import dataclasses
import json
import random
import struct

import pytest
import torch

from checkpoint import load_checkpoint, save_checkpoint
from model import (
    Llama,
    LlamaConfig,
    apply_rotary,
    rope_frequencies,
    rotary_cos_sin,
)
from pretrained.load_llama import (
    config_from_hf,
    hf_permute,
    hf_unpermute,
    init_mask_embedding,
    load_hf_checkpoint,
    load_llama,
    load_meta_checkpoint,
    read_safetensors,
    write_safetensors,
)
from pretrained.shapes import LLAMA_PRESETS

# llama-tiny's params.json, written out by hand. Meta's params.json has no field for the rope's
# original context (Meta's code fixes it at 8192), so the Meta-layout reference model uses 8192, not
# the preset's 64.
TINY_PARAMS = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 320,
               "multiple_of": 32, "ffn_dim_multiplier": 1.3, "norm_eps": 1e-5,
               "rope_theta": 500000.0, "use_scaled_rope": True}


def tiny_config_json(original_context):
    """llama-tiny's config.json as HF writes it; FFN int(1.3 * int(8 * 64 / 3)) = 221 -> 224."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 224, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 320,
            "max_position_embeddings": 512,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": original_context,
                             "rope_type": "llama3"},
            "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "torch_dtype": "float32", "bos_token_id": 128000,
            "eos_token_id": 128001, "use_cache": True}


def tiny_config_json_v5(original_context):
    """The same config.json as transformers 5.x writes it: rope_theta moves into one
    "rope_parameters" object, which replaces "rope_scaling"; "dtype" replaces "torch_dtype"."""
    cfg = {k: v for k, v in tiny_config_json(original_context).items()
           if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    return {**cfg, "dtype": "float32", "transformers_version": "5.0.0",
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": original_context}}


HF_LAYER_NAMES = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
                  "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
                  "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
                  "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm",
                  "ffn_norm": "post_attention_layernorm"}
HF_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight",
                "norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def tiny_llama(original_context=8192, tied=False):
    """llama-tiny (4 query / 2 K-V heads, Llama 3.1 rope scaling) with every weight random, norms
    included; tied: its output head is its embedding matrix, as Llama 3.2 1B/3B."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**LLAMA_PRESETS["llama-tiny"],
                                 "rope_original_context": original_context,
                                 "tie_word_embeddings": tied}))
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
    """Two shards routed by model.safetensors.index.json (layer 0 split between them), or a file."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config_json))
    if not sharded:
        return write_safetensors(tensors, directory / "model.safetensors",
                                 metadata={"format": "pt"})
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:7],
              "model-00002-of-00002.safetensors": names[7:]}
    assert "model.layers.0.mlp.up_proj.weight" in names[:7]
    assert "model.layers.0.self_attn.q_proj.weight" in names[7:]
    for shard, shard_names in shards.items():
        write_safetensors({n: tensors[n] for n in shard_names}, directory / shard)
    index = {"metadata": {"total_size": 0},
             "weight_map": {n: s for s, ns in shards.items() for n in ns}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def assert_same_model(loaded, ref):
    ref_sd, got_sd = ref.state_dict(), loaded.state_dict()
    assert got_sd.keys() == ref_sd.keys()
    for name in ref_sd:
        assert torch.equal(got_sd[name], ref_sd[name]), name
    assert torch.equal(loaded.inv_freq, ref.inv_freq)
    assert all(p.requires_grad and p.device.type == "cpu" for p in loaded.parameters())
    idx = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(1))
    for pos in (None, torch.arange(480, 496)):  # late positions: the scaled low frequencies matter
        with torch.no_grad():
            (got, _), (want, _) = loaded(idx, pos=pos), ref(idx, pos=pos)
        assert (got - want).abs().max() <= 1e-5


# -----------------------------------------------------------------------------
# rotary permutation


def test_hf_permute_by_hand():
    w = torch.arange(8.0).view(8, 1)  # 2 heads of head_dim 4; Meta pairs (0,1),(2,3) per head
    # HF: the first elements of the pairs, then the second ones
    assert hf_permute(w, 2).flatten().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
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
    wq, x = torch.randn(nh * hd, config.dim), torch.randn(T, config.dim)
    pos = torch.arange(100, 100 + T)
    inv_freq = rope_frequencies(config)  # (hd/2,)
    cos, sin = rotary_cos_sin(pos, inv_freq)
    q_meta = apply_rotary((x @ wq.T).view(1, T, nh, hd).transpose(1, 2), cos, sin)[0]  # (nh, T, hd)
    q_hf = rotate_half_rope((x @ hf_permute(wq, nh).T).view(T, nh, hd).transpose(0, 1), pos,
                            inv_freq)  # (nh, T, hd)
    # HF dim -> Meta dim
    meta_dim_of = [2 * j for j in range(hd // 2)] + [2 * j + 1 for j in range(hd // 2)]
    assert torch.allclose(q_hf, q_meta[..., meta_dim_of], atol=1e-5)  # same vector, dims reordered


# -----------------------------------------------------------------------------
# loading


def test_meta_layout_loads_exactly(tmp_path):
    ref = tiny_llama()
    save_meta(ref, tmp_path / "meta")
    loaded = load_meta_checkpoint(tmp_path / "meta")
    assert_same_model(loaded, ref)
    # params.json cannot state max_seq_len (Meta passes it at run time): the rest must round-trip
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
    save_hf({k: v.bfloat16() for k, v in to_hf(ref).items()}, tmp_path / "hf",
            tiny_config_json(8192), sharded=False)
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
    assert info["format"] == "hf"
    assert info["tokenizer_path"] == str(repo / "original" / "tokenizer.model")
    save_meta(ref, tmp_path / "only_original" / "original")
    meta_model, info = load_llama(tmp_path / "only_original")
    assert info["format"] == "meta"
    assert info["weights_dir"] == str(tmp_path / "only_original" / "original")
    assert_same_model(hf_model, ref)
    assert_same_model(meta_model, hf_model)  # both layouts give the same parameters and logits
    (tmp_path / "empty").mkdir()
    for missing in (tmp_path / "empty", tmp_path / "nowhere"):
        with pytest.raises(ValueError, match="params.json.*config.json"):
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


def test_hf_config_in_both_transformers_forms(tmp_path):
    """transformers 5.x's config.json ("rope_parameters") loads exactly, to the 4.x form's one."""
    ref = tiny_llama(original_context=64)
    save_hf(to_hf(ref), tmp_path / "hf5", tiny_config_json_v5(64), sharded=False)
    loaded = load_hf_checkpoint(tmp_path / "hf5")
    assert_same_model(loaded, ref)
    want = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=320, norm_eps=1e-5,
                       max_seq_len=512, rope_theta=500000.0, use_scaled_rope=True,
                       rope_scale_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                       rope_original_context=64, ffn_hidden_size=224)  # by hand
    assert loaded.config == want == config_from_hf(tiny_config_json(64), "config.json")
    # Llama 3.0 (no frequency scaling): rope_scaling null in 4.x, rope_type "default" in 5.x
    v4 = {**tiny_config_json(64), "rope_scaling": None}
    v5 = {**tiny_config_json_v5(64),
          "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}
    # rope_original_context unused: the default
    unscaled = dataclasses.replace(want, use_scaled_rope=False, rope_original_context=8192)
    assert config_from_hf(v4, "4.x") == config_from_hf(v5, "5.x") == unscaled
    both = {**tiny_config_json(64),  # stated twice
            "rope_parameters": tiny_config_json_v5(64)["rope_parameters"]}
    assert config_from_hf(both, "both") == want


def test_tied_embeddings_load_exactly_and_stay_tied(tmp_path):
    """Llama 3.2 1B/3B tie the output head to the embeddings. The reference: an untied model whose
    head is a copy of the embedding matrix (same logits), and whose two gradients add up to the tied
    matrix's one gradient."""
    ref = tiny_llama(tied=True)
    assert ref.output.weight is ref.tok_embeddings.weight
    untied = Llama(dataclasses.replace(ref.config, tie_word_embeddings=False))
    untied.load_state_dict({k: v.clone() for k, v in ref.state_dict().items()})  # two copies
    assert untied.output.weight is not untied.tok_embeddings.weight
    idx = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(3))
    for model in (ref, untied):
        model(idx, idx)[1].backward()
    assert torch.allclose(ref.output.weight.grad,
                          untied.output.weight.grad + untied.tok_embeddings.weight.grad, atol=1e-6)

    hf_files = to_hf(ref)  # lm_head.weight: a copy of the embeddings, as HF writes if asked to
    no_head = {k: v for k, v in hf_files.items() if k != "lm_head.weight"}  # as HF ships tied ones
    tied_json = {**tiny_config_json(8192), "tie_word_embeddings": True}
    save_hf(no_head, tmp_path / "hf", tied_json)
    save_hf(hf_files, tmp_path / "hf_with_head",
            tiny_config_json_v5(8192) | {"tie_word_embeddings": True}, sharded=False)
    save_meta(ref, tmp_path / "meta")  # Meta's 3.2 files hold output.weight as an exact copy
    sd = {k: v for k, v in ref.state_dict().items() if k != "output.weight"}
    save_meta(ref, tmp_path / "meta_no_head", state_dict=sd)
    for name in ("hf", "hf_with_head", "meta", "meta_no_head"):
        loaded, _ = load_llama(tmp_path / name)
        assert loaded.config.tie_word_embeddings, name
        assert loaded.output.weight is loaded.tok_embeddings.weight, name
        assert_same_model(loaded, untied)
        n_params = sum(p.numel() for p in ref.parameters())
        assert sum(p.numel() for p in loaded.parameters()) == n_params

    # a train.py checkpoint (save_checkpoint -> load_checkpoint / model_from_checkpoint): still tied
    ckpt = dict(model_family="llama", model_args=dataclasses.asdict(loaded.config),
                model=loaded.state_dict(), stage="ntp")
    save_checkpoint(ckpt, tmp_path / "ckpt.pt")
    back, _ = load_checkpoint(tmp_path / "ckpt.pt")
    assert back.output.weight is back.tok_embeddings.weight
    assert_same_model(back, untied)
    bad = dict(ckpt, model={**ckpt["model"], "output.weight": torch.randn(320, 64)})
    save_checkpoint(bad, tmp_path / "bad.pt")
    expect_error(lambda: load_checkpoint(tmp_path / "bad.pt"), "output.weight",
                 "tok_embeddings.weight")

    # .to(dtype) and init_mask_embedding: still one matrix, so the mask token's output row is its
    # new input row. (to_empty, and .to() with overwrite_module_params_on_conversion, give each
    # module a new Parameter)
    with torch.device("meta"):
        empty = Llama(ref.config)
    assert empty.to_empty(device="cpu").output.weight is empty.tok_embeddings.weight
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        back = back.to(torch.bfloat16)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert back.output.weight is back.tok_embeddings.weight
    assert back.output.weight.dtype == torch.bfloat16
    emb = back.tok_embeddings.weight.detach().float().clone()
    init_mask_embedding(back, mask_id=300)
    assert back.output.weight is back.tok_embeddings.weight
    mean = torch.cat([emb[:300], emb[301:]]).mean(0)
    assert torch.allclose(back.output.weight[300].float(), mean, atol=1e-2)  # bf16
    assert torch.equal(back.output.weight[:300].float(), emb[:300])

    # a tied config with a different head is an error; an untied one without a head too
    save_hf({**no_head, "lm_head.weight": torch.randn(320, 64)}, tmp_path / "other_head", tied_json,
            sharded=False)
    expect_error(lambda: load_hf_checkpoint(tmp_path / "other_head"), "lm_head.weight",
                 "tie_word_embeddings", tmp_path / "other_head")
    save_hf(no_head, tmp_path / "untied_no_head", tiny_config_json(8192), sharded=False)
    expect_error(lambda: load_hf_checkpoint(tmp_path / "untied_no_head"), "output.weight")


def hand_count(dim, n_layers, n_heads, n_kv_heads, ffn, vocab, tied):
    """Parameters of a Llama, counted from its matrices (docs/llama.md's block): embeddings, per
    layer q/k/v/o, three FFN matrices and two norms, the final norm, and the output head unless it
    is the embedding matrix."""
    head_dim = dim // n_heads
    attention = dim * n_heads * head_dim * 2 + dim * n_kv_heads * head_dim * 2  # wq, wo; wk, wv
    layer = attention + 3 * dim * ffn + 2 * dim
    return vocab * dim + n_layers * layer + dim + (0 if tied else vocab * dim)


def test_presets_have_the_published_shapes():
    """Llama 3.2 1B / 3B and 3.1 8B: parameter counts by hand == the published ones == the presets'
    (built on the meta device, no memory); and each preset is the model its published config.json
    describes."""
    published = {
        "llama3.2-1b": (hand_count(2048, 16, 32, 8, 8192, 128256, tied=True), 1_235_814_400),
        "llama3.2-3b": (hand_count(3072, 28, 24, 8, 8192, 128256, tied=True), 3_212_749_824),
        "llama3.1-8b": (hand_count(4096, 32, 32, 8, 14336, 128256, tied=False), 8_030_261_248)}
    hf_json = {"llama3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   head_dim=64),
               "llama3.2-3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                                   head_dim=128)}
    for name, (by_hand, count) in published.items():
        with torch.device("meta"):
            model = Llama(LlamaConfig(**LLAMA_PRESETS[name]))
        assert by_hand == count == sum(p.numel() for p in model.parameters()), name
        assert (model.output.weight is model.tok_embeddings.weight) == (name != "llama3.1-8b")
        if name in hf_json:  # the published config.json, less what all Llama 3.x share (tiny_...)
            cfg = {**tiny_config_json(8192), **hf_json[name], "intermediate_size": 8192,
                   "num_key_value_heads": 8, "vocab_size": 128256,
                   "max_position_embeddings": 131072, "tie_word_embeddings": True}
            cfg["rope_scaling"] = {**cfg["rope_scaling"], "factor": 32.0}
            with torch.device("meta"):
                from_hf = Llama(config_from_hf(cfg, f"{name} config.json"))
            assert {k: v.shape for k, v in from_hf.state_dict().items()} == \
                   {k: v.shape for k, v in model.state_dict().items()}
            assert torch.equal(rope_frequencies(from_hf.config), rope_frequencies(model.config))
            assert model.config.ffn_hidden == 8192
            assert model.config.head_dim == hf_json[name]["head_dim"]


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
    names = {"shape": "output.weight", "missing": "layers.1.ffn_norm.weight",
             "unexpected": "layers.0.attention.wq.bias"}
    for case, state_dict in cases.items():
        save_meta(ref, tmp_path / case, state_dict=state_dict)
        expect_error(lambda: load_meta_checkpoint(tmp_path / case), names[case], tmp_path / case)
    save_meta(ref, tmp_path / "vision", params={**TINY_PARAMS, "vision_chunk_size": 448})
    expect_error(lambda: load_meta_checkpoint(tmp_path / "vision"), "vision_chunk_size",
                 "params.json")
    save_meta(ref, tmp_path / "two")
    torch.save(good, tmp_path / "two" / "consolidated.01.pth")
    expect_error(lambda: load_meta_checkpoint(tmp_path / "two"), "single-shard")


def test_hf_checkpoint_errors(tmp_path):
    ref = tiny_llama()
    good = to_hf(ref)
    save_hf({**good, "model.layers.1.self_attn.k_proj.weight": torch.randn(16, 64)},
            tmp_path / "shape", tiny_config_json(8192))
    expect_error(lambda: load_hf_checkpoint(tmp_path / "shape"), "layers.1.attention.wk.weight",
                 "(16, 64)")
    save_hf({**good, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, tmp_path / "extra",
            tiny_config_json(8192), sharded=False)
    expect_error(lambda: load_hf_checkpoint(tmp_path / "extra"),
                 "model.layers.0.self_attn.q_norm.weight")
    changes = {"head_dim": {"head_dim": 32}, "tie_word_embeddings": {"tie_word_embeddings": "yes"},
               "rope": {"rope_scaling": {"type": "yarn", "factor": 4.0}},
               "unknown": {"sliding_window": 8}}
    for case, change in changes.items():
        save_hf(good, tmp_path / case, {**tiny_config_json(8192), **change}, sharded=False)
        expect_error(lambda: load_hf_checkpoint(tmp_path / case), "config.json", next(iter(change)))
    v5, rope5 = tiny_config_json_v5(8192), tiny_config_json_v5(8192)["rope_parameters"]
    for cfg, phrase in [
            ({**v5, "rope_parameters": {**rope5, "rope_type": "yarn"}}, "'yarn'"),
            ({**v5, "rope_parameters": {**rope5, "beta_fast": 32}}, "beta_fast"),
            ({**v5, "rope_parameters": {**rope5, "partial_rotary_factor": 0.5}},
             "partial_rotary_factor"),
            ({**v5, "rope_parameters": {"rope_type": "default"}}, "no 'rope_theta'"),
            ({**v5, "rope_theta": 10000.0}, "'rope_theta' is stated twice"),
            ({**v5, "rope_parameters": {**rope5, "type": "linear"}}, "'rope_type' is stated twice"),
            ({**v5, "rope_parameters": [500000.0]},
             "rope_parameters=[500000.0] is not a JSON object")]:
        expect_error(lambda: config_from_hf(cfg, "config.json"), "config.json", phrase)


# -----------------------------------------------------------------------------
# safetensors


def test_safetensors_round_trip(tmp_path):
    tensors = {"bf16": torch.randn(3, 4).bfloat16(), "f16": torch.randn(5).half(),
               "f32": torch.randn(2, 3, 4), "f64": torch.randn(3).double(),
               "i64": torch.arange(-3, 4), "i32": torch.arange(6, dtype=torch.int32),
               "i16": torch.tensor([-7, 7], dtype=torch.int16),
               "i8": torch.tensor([-128, 127], dtype=torch.int8),
               "u8": torch.tensor([0, 255], dtype=torch.uint8),
               "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(3.5),
               "scalar_bf16": torch.tensor(-2.0).bfloat16(), "empty": torch.zeros(0, 3)}
    write_safetensors(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    loaded = read_safetensors(tmp_path / "t.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
        assert torch.equal(loaded[name], t), name


def raw_file(path, header, data, pad=b""):
    """A safetensors file built by hand: u64 little-endian header size, JSON header, data."""
    raw = (header if isinstance(header, bytes) else json.dumps(header).encode()) + pad
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_reads_hand_built_bytes(tmp_path):
    header = {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
              "b": {"dtype": "F32", "shape": [], "data_offsets": [6, 10]},
              "__metadata__": {"format": "pt"}}
    # bf16 1, 2, -3; f32 2.5
    data = struct.pack("<3H", 0x3F80, 0x4000, 0xC040) + struct.pack("<f", 2.5)
    loaded = read_safetensors(raw_file(tmp_path / "h.safetensors", header, data, pad=b"   "))
    assert loaded["a"].dtype == torch.bfloat16 and loaded["a"].tolist() == [1.0, 2.0, -3.0]
    assert loaded["b"].shape == () and loaded["b"].item() == 2.5  # read from an unaligned offset
    write_safetensors({"x": torch.tensor([1.0, -2.0]).bfloat16()}, tmp_path / "w.safetensors")
    raw = (tmp_path / "w.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    assert json.loads(raw[8:8 + n])["x"] == {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}
    assert raw[8 + n:] == struct.pack("<2H", 0x3F80, 0xC000)


def test_safetensors_errors(tmp_path):
    f32 = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    cases = {
        "truncated": (raw_file(tmp_path / "truncated.st", f32, b"\0" * 5), ["'x'", "past the end"]),
        "offsets": (raw_file(tmp_path / "offsets.st", {"x": {**f32["x"], "data_offsets": [8, 16]}},
                             b"\0" * 8), ["'x'", "past the end"]),
        "count": (raw_file(tmp_path / "count.st", {"x": {**f32["x"], "shape": [3]}}, b"\0" * 12),
                  ["'x'", "12 bytes"]),
        "json": (raw_file(tmp_path / "json.st", b"{oops", b""), ["not valid JSON"]),
        "dtype": (raw_file(tmp_path / "dtype.st", {"x": {**f32["x"], "dtype": "Q4"}}, b"\0" * 8),
                  ["'x'", "'Q4'"]),
    }
    (tmp_path / "huge.st").write_bytes(struct.pack("<Q", 200_000_000) + b"{}")
    (tmp_path / "short_header.st").write_bytes(struct.pack("<Q", 64) + b"{}")
    (tmp_path / "tiny.st").write_bytes(b"\1\2\3")
    cases.update(huge=(tmp_path / "huge.st", ["100 MB"]),
                 short_header=(tmp_path / "short_header.st", ["truncated"]),
                 tiny=(tmp_path / "tiny.st", ["truncated"]))
    for path, phrases in cases.values():
        expect_error(lambda: read_safetensors(path), path, *phrases)


def f32_entry(begin, n=2):
    return {"dtype": "F32", "shape": [n], "data_offsets": [begin, begin + 4 * n]}


def test_safetensors_layout_errors(tmp_path):
    """The tensors must tile the data section: contiguous in offset order, from 0 to the end."""
    data = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)  # a = [1, 2], b = [3, 4]
    good = {"a": f32_entry(0), "b": f32_entry(8)}
    # the JSON's order is free: b listed first, and an empty tensor between them, are fine
    reordered = {"b": good["b"], "e": f32_entry(8, 0), "a": good["a"]}
    loaded = read_safetensors(raw_file(tmp_path / "order.st", reordered, data))
    assert loaded["a"].tolist() == [1.0, 2.0] and loaded["b"].tolist() == [3.0, 4.0]
    assert loaded["e"].shape == (0,)
    # a header size short by (part of) its padding: the JSON still parses, every tensor would shift
    # by 3 bytes
    header = json.dumps(good).encode() + b"     "
    (tmp_path / "short.st").write_bytes(struct.pack("<Q", len(header) - 3) + header + data)
    expect_error(lambda: read_safetensors(tmp_path / "short.st"), tmp_path / "short.st",
                 "end at data byte 16", "holds 19 data bytes")
    good_b = good["b"]
    cases = {
        "trailing": (good, data + b"\0\0\0\0", ["end at data byte 16", "holds 20 data bytes"]),
        "overlap": ({"a": f32_entry(0), "b": f32_entry(4)}, data[:12], ["'b'", "overlaps"]),
        "gap": ({"a": f32_entry(0), "b": f32_entry(12)}, data + data[:4],
                ["'b'", "gap of 4 bytes"]),
        "late_start": ({"a": f32_entry(4), "b": f32_entry(12)}, data + data[:4],
                       ["'a'", "gap of 4 bytes"]),
        "float_offset": ({**good, "b": {**good_b, "data_offsets": [8, 16.0]}}, data,
                         ["'b'", "[8, 16.0]"]),
        "bool_dim": ({**good, "b": {**good_b, "shape": [True, 2]}}, data, ["'b'", "[True, 2]"]),
        "negative_dims": ({**good, "b": {**good_b, "shape": [-1, -2]}}, data, ["'b'", "[-1, -2]"]),
        "extra_key": ({**good, "b": {**good_b, "strides": [1]}}, data, ["'b'", "strides"]),
        "metadata": ({**good, "__metadata__": {"step": 3}}, data, ["__metadata__"]),
        "bool_bytes": ({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}}, b"\0\1\2",
                       ["'m'", "BOOL"])}
    for case, (header, data_bytes, phrases) in cases.items():
        path = raw_file(tmp_path / f"{case}.st", header, data_bytes)
        expect_error(lambda: read_safetensors(path), path, *phrases)
    raw = json.dumps(good).encode()
    for case, text in {"dup_tensor": raw.replace(b'"b"', b'"a"'),
                       "dup_field": raw.replace(b'"shape"', b'"dtype"', 1),
                       "not_utf8": raw.replace(b'"b"', b'"\xff"')}.items():
        path = raw_file(tmp_path / f"{case}.st", text, data)
        expect_error(lambda: read_safetensors(path), path, "not valid JSON")
    expect_error(lambda: read_safetensors(tmp_path / "dup_tensor.st"), "'a' appears twice")


def test_safetensors_fuzz_never_loads_different_numbers(tmp_path):
    """Damage a valid file's layout many ways (seeded): bit flips in the header size and the JSON,
    truncation, appended bytes, an edited header size, edited offsets and shapes, swapped byte
    ranges. Every damaged file must raise ValueError or load exactly the original tensors. (Changed
    data bytes, or a name or dtype flipped into another valid one, make a different valid file that
    no format check can see: those are not tried.)"""
    rng = random.Random(0)
    # 12, 10, 16, 5, 4, 2, 8 bytes
    tensors = {"f32": torch.randn(3), "bf16": torch.randn(1, 5).bfloat16(),
               "i64": torch.tensor([7, -7]), "u8": torch.arange(5, dtype=torch.uint8),
               "mask": torch.tensor([True, False, True, True]), "f16": torch.tensor([1.5]).half(),
               "f64": torch.randn(1, 1).double()}
    dtypes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.uint8: "U8",
              torch.bool: "BOOL", torch.float16: "F16", torch.float64: "F64"}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    data = b"".join(t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors.values())
    path = raw_file(tmp_path / "good.st", header, data, pad=b" " * 7)
    good = path.read_bytes()
    n_header = struct.unpack("<Q", good[:8])[0]
    assert read_safetensors(path).keys() == tensors.keys()
    # names and metadata: free text, any flip is valid
    free_text = [i for word in [*tensors, "pt", "format"]
                 for s in [good.index(f'"{word}"'.encode())]
                 for i in range(s + 1, s + 1 + len(word))]

    def with_header(h, delta=0):
        raw = json.dumps(h).encode() + b" " * 7
        return struct.pack("<Q", len(raw) + delta) + raw + data

    def damaged():
        kind = rng.randrange(7)
        if kind == 0:  # one bit flipped in the header size or the JSON (not in free text)
            i = rng.choice([i for i in range(8 + n_header) if i not in free_text])
            return good[:i] + bytes([good[i] ^ (1 << rng.randrange(8))]) + good[i + 1:]
        if kind == 1:
            return good[:rng.randrange(len(good))]
        if kind == 2:
            return good + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        if kind == 3:  # the header size off by a few bytes (into the padding or data) or far off
            far = rng.randrange(-2**20, 2**20)
            return with_header(header, rng.choice([d for d in range(-9, 10) if d] + [far]))
        h = json.loads(json.dumps(header))
        a, b = rng.sample(list(tensors), 2)
        if kind == 4:  # one offset moved
            h[a]["data_offsets"][rng.randrange(2)] += rng.choice([d for d in range(-9, 10) if d])
        elif kind == 5:  # one dimension changed
            h[a]["shape"][rng.randrange(len(h[a]["shape"]))] += rng.choice([-1, 1, 2])
        else:  # two tensors' byte ranges swapped (all sizes differ)
            h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]
        return with_header(h)

    outcomes = {"rejected": 0, "same": 0}
    for _ in range(400):
        path.write_bytes(damaged())
        try:
            loaded = read_safetensors(path)
        except ValueError:
            outcomes["rejected"] += 1
            continue
        assert loaded.keys() == tensors.keys()
        for name, t in tensors.items():
            assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
            assert torch.equal(loaded[name].reshape(-1).view(torch.uint8),
                               t.reshape(-1).view(torch.uint8)), name
        outcomes["same"] += 1
    assert outcomes["rejected"] > 350, outcomes
