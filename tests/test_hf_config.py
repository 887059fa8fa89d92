"""config.json is judged by what each key means (load_llama.config_from_hf). A real Llama-family
config loads: SmolLM2-135M's published fields (as a tiny checkpoint that must match a reference
model built from the same weights), Llama 3.1 / 3.2's in both transformers forms. Every key that
changes the forward pass is refused by name when its value is one model.Llama does not compute,
a Qwen2 config among them; metadata is accepted silently; a key the loader does not know gives one
printed line and the load goes on, or an error with strict_config=True."""

import dataclasses

import pytest
import torch

from model import Llama, LlamaConfig
from pretrained.load_llama import (
    HF_CHECKED,
    HF_CONFIG,
    HF_NEUTRAL,
    config_from_hf,
    load_hf_checkpoint,
    load_llama,
)
from pretrained.shapes import LLAMA_PRESETS
from test_llama_io import (
    assert_same_model,
    expect_error,
    save_hf,
    tiny_config_json,
    tiny_config_json_v5,
    tiny_llama,
    to_hf,
)

# SmolLM2-135M's config.json as published (HuggingFaceTB/SmolLM2-135M). is_llama_config and
# rope_interleaved come from the nanotron converter it was written with.
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "vocab_size": 49152}
# Shrunk for a CPU test; every other field above is kept as published, the 9 query and 3 K/V heads
# included (so head_dim shrinks from 64 to 8).
SMOLLM2_SHRUNK = {"hidden_size": 72, "intermediate_size": 96, "num_hidden_layers": 2,
                  "vocab_size": 256}
# What SmolLM2-135M-Instruct's config states differently (as transformers prints it), and the two
# keys transformers writes into the config.json of a model it dequantized from a GGUF file.
SMOLLM2_INSTRUCT = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "head_dim": 64,
                    "mlp_bias": False, "transformers_version": "4.51.1",
                    "transformers.js_config": {"kv_cache_dtype": {"fp16": "float16",
                                                                  "q4f16": "float16"}}}
FROM_GGUF = {"unk_token_id": 0, "_name_or_path": "SmolLM2-135M-Instruct-Q4_1.gguf"}

# Published config.json of Llama 3.1 8B and Llama 3.2 1B / 3B (transformers 4.x form)
LLAMA3_COMMON = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256}
LLAMA3_PUBLISHED = {
    "llama3.1-8b": {**LLAMA3_COMMON, "hidden_size": 4096, "intermediate_size": 14336,
                    "num_attention_heads": 32, "num_hidden_layers": 32,
                    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192,
                                     "rope_type": "llama3"},
                    "tie_word_embeddings": False, "transformers_version": "4.43.0.dev0"},
    "llama3.2-1b": {**LLAMA3_COMMON, "head_dim": 64, "hidden_size": 2048, "intermediate_size": 8192,
                    "num_attention_heads": 32, "num_hidden_layers": 16,
                    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                                     "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192,
                                     "rope_type": "llama3"},
                    "tie_word_embeddings": True, "transformers_version": "4.45.0.dev0"},
}
LLAMA3_PUBLISHED["llama3.2-3b"] = {**LLAMA3_PUBLISHED["llama3.2-1b"], "head_dim": 128,
                                   "hidden_size": 3072, "num_attention_heads": 24,
                                   "num_hidden_layers": 28}

# Qwen2.5-0.5B's config.json: Llama's shape plus biases on q/k/v, which config.json does not state
# (Qwen2's code always has them); its window is switched off by use_sliding_window.
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": 151936}


def v5_form(cfg):
    """A 4.x config.json as transformers 5.x writes it: rope_theta and rope_scaling become one
    rope_parameters object, torch_dtype becomes dtype."""
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    rope = {"rope_theta": cfg["rope_theta"], **(cfg["rope_scaling"] or {"rope_type": "default"})}
    return {**out, "rope_parameters": rope, "dtype": cfg["torch_dtype"],
            "transformers_version": "5.0.0"}


# -----------------------------------------------------------------------------
# real configs load


def test_smollm2_published_config_loads_and_matches_reference(tmp_path, capsys):
    """A tiny SmolLM2 in HF layout (tied: no lm_head.weight in the file), its config.json the
    published one with the sizes shrunk. The reference is a model.Llama built by hand from the
    published values and holding the same weights: same config, same parameters, same logits."""
    want = LlamaConfig(dim=72, n_layers=2, n_heads=9, n_kv_heads=3, vocab_size=256, norm_eps=1e-5,
                       rope_theta=100000.0, use_scaled_rope=False, max_seq_len=8192,
                       ffn_hidden_size=96, tie_word_embeddings=True)  # by hand
    torch.manual_seed(0)
    ref = Llama(want).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms start at exactly 1; make a swapped norm show
    files = {k: v for k, v in to_hf(ref).items() if k != "lm_head.weight"}
    save_hf(files, tmp_path / "smol", {**SMOLLM2_135M, **SMOLLM2_SHRUNK}, sharded=False)

    loaded, info = load_llama(tmp_path / "smol")
    assert capsys.readouterr().out == ""  # every published key is known: nothing to report
    assert info["format"] == "hf" and loaded.config == want
    assert loaded.output.weight is loaded.tok_embeddings.weight
    got_sd, ref_sd = loaded.state_dict(), ref.state_dict()
    assert got_sd.keys() == ref_sd.keys()
    assert all(torch.equal(got_sd[k], ref_sd[k]) for k in ref_sd)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for pos in (None, torch.arange(8100, 8116)):  # late positions too: rope_theta 1e5, unscaled
        with torch.no_grad():
            (got, _), (ref_logits, _) = loaded(idx, pos=pos), ref(idx, pos=pos)
        assert torch.equal(got, ref_logits)
    strict, _ = load_llama(tmp_path / "smol", strict_config=True)  # the strict gate agrees
    assert strict.config == want


def test_smollm2_instruct_and_gguf_converted_keys_are_metadata(capsys):
    """The Instruct model's other fields and the keys of a config transformers wrote for a model
    converted from GGUF change nothing: the same config, nothing printed, strict gate or not."""
    base = config_from_hf(SMOLLM2_135M, "config.json")
    for cfg in ({**SMOLLM2_135M, **SMOLLM2_INSTRUCT},
                {**SMOLLM2_135M, **SMOLLM2_INSTRUCT, **FROM_GGUF}):
        assert config_from_hf(cfg, "config.json", strict_config=True) == base
    assert capsys.readouterr().out == ""
    assert base.n_heads == 9 and base.n_kv_heads == 3 and base.head_dim == 64
    assert base.ffn_hidden == 1536 and base.tie_word_embeddings and not base.use_scaled_rope


@pytest.mark.parametrize("name", sorted(LLAMA3_PUBLISHED))
def test_llama3_published_configs_in_both_transformers_forms(name, capsys):
    """Each published config.json, as published (4.x) and as transformers 5.x writes it, is the
    preset of that model (whose FFN width is a recipe, not a number: compared as a number)."""
    preset = LlamaConfig(**LLAMA_PRESETS[name])
    want = dataclasses.replace(preset, ffn_hidden_size=preset.ffn_hidden)
    for cfg in (LLAMA3_PUBLISHED[name], v5_form(LLAMA3_PUBLISHED[name])):
        got = config_from_hf(cfg, f"{name} config.json", strict_config=True)
        assert dataclasses.replace(got, multiple_of=preset.multiple_of,
                                   ffn_dim_multiplier=preset.ffn_dim_multiplier) == want
    assert capsys.readouterr().out == ""


def test_metadata_and_neutral_values_load_silently(capsys):
    """Metadata is accepted whatever its value; a math key is accepted at the value model.Llama
    computes with, or absent (transformers' default is that value). pretraining_tp > 1 made
    transformers 4.x compute the same matmuls in slices (5.x ignores it): accepted too."""
    base = tiny_config_json(8192)
    want = config_from_hf(base, "config.json")
    metadata = {"is_llama_config": False, "torch_dtype": "float16", "temperature": 0.6,
                "top_p": 0.9, "pad_token_id": 0, "unk_token_id": None, "_name_or_path": "/x",
                "attention_dropout": 0.1, "initializer_range": 1.0, "max_window_layers": 2}
    neutral = {"pretraining_tp": 2, "use_sliding_window": False, "sliding_window": 4,
               "architectures": None, "head_dim": None, "qk_norm": False, "hidden_act": "swish",
               "embedding_multiplier": 1.0, "num_experts": 0, "quantization_config": None,
               "layer_types": ["full_attention"] * 2, "partial_rotary_factor": 1.0}
    for change in (metadata, neutral):
        assert config_from_hf({**base, **change}, "config.json", strict_config=True) == want
    absent = {k: v for k, v in base.items() if k not in ("model_type", "hidden_act", "mlp_bias")}
    assert config_from_hf(absent, "config.json") == want
    assert capsys.readouterr().out == ""


# -----------------------------------------------------------------------------
# keys that change the math: refused by name


REFUSED = [  # changes to llama-tiny's config.json (64 wide, 4 heads, 2 K/V heads); each is refused
    {"model_type": "mistral"}, {"model_type": "qwen2"}, {"architectures": ["MistralForCausalLM"]},
    {"architectures": ["LlamaForSequenceClassification"]}, {"hidden_act": "gelu_pytorch_tanh"},
    {"attention_bias": True}, {"mlp_bias": True}, {"rope_interleaved": True},
    {"use_sliding_window": True}, {"use_mrope": True}, {"qk_norm": True}, {"use_qk_norm": True},
    {"qk_layernorm": True}, {"qk_layer_norms": True}, {"attn_logit_softcapping": 50.0},
    {"final_logit_softcapping": 30.0}, {"embedding_multiplier": 12.0}, {"scale_emb": 12},
    {"residual_multiplier": 0.22}, {"logits_scaling": 8.0}, {"logit_scale": 0.0625},
    {"attention_multiplier": 0.0078125}, {"scale_depth": 1.4}, {"num_experts": 8},
    {"num_local_experts": 8}, {"n_routed_experts": 64}, {"n_shared_experts": 2},
    {"num_experts_per_tok": 2}, {"moe_intermediate_size": 1408},
    {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
    {"auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}},
    {"is_encoder_decoder": True}, {"add_cross_attention": True}, {"pruned_heads": {"0": [1]}},
    {"hidden_size": 66}, {"hidden_size": 64.0}, {"num_hidden_layers": 0}, {"vocab_size": -1},
    {"num_attention_heads": True}, {"num_key_value_heads": 3}, {"max_position_embeddings": 2.5},
    {"intermediate_size": "224"}, {"rms_norm_eps": "1e-5"}, {"head_dim": 32},
    {"tie_word_embeddings": "yes"}, {"pretraining_tp": 0}, {"sliding_window": 4096},
    {"layer_types": ["sliding_attention", "full_attention"]}, {"rope_theta": -1.0},
    {"partial_rotary_factor": 0.5},
]
ROPE_TYPES = {"linear": {"factor": 2.0}, "dynamic": {"factor": 2.0},
              "yarn": {"factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32},
              "longrope": {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
              "proportional": {"factor": 2.0}}


@pytest.mark.parametrize("change", REFUSED, ids=lambda change: repr(change)[1:-1])
def test_math_key_with_unsupported_value_is_refused_by_name(change):
    (key, value), = change.items()
    expect_error(lambda: config_from_hf({**tiny_config_json(8192), **change}, "config.json"),
                 "config.json: unsupported config.json", f"{key}={value!r}")


@pytest.mark.parametrize("rope_type", sorted(ROPE_TYPES))
def test_rope_types_other_than_llama3_and_default_are_refused(rope_type):
    scaling = {"rope_type": rope_type, **ROPE_TYPES[rope_type]}
    v4 = {**tiny_config_json(8192), "rope_scaling": scaling}
    v5 = {**tiny_config_json_v5(8192), "rope_parameters": {"rope_theta": 500000.0, **scaling}}
    old_spelling = {**tiny_config_json(8192), "rope_scaling": {"type": rope_type,
                                                               **ROPE_TYPES[rope_type]}}
    for cfg in (v4, v5, old_spelling):
        expect_error(lambda: config_from_hf(cfg, "config.json"), "rope_type", repr(rope_type))
    partial = {**tiny_config_json_v5(8192), "rope_parameters": {
        **tiny_config_json_v5(8192)["rope_parameters"], "partial_rotary_factor": 0.25}}
    expect_error(lambda: config_from_hf(partial, "config.json"), "partial_rotary_factor=0.25")


def test_every_math_key_has_a_refusal_test():
    """The keys config_from_hf treats as changing the forward pass are exactly those covered here
    (the rotary ones by the rope tests), so a key added to the table needs a test to go with it."""
    covered = {k for change in REFUSED for k in change} | {"rope_scaling", "rope_parameters"}
    assert set(HF_NEUTRAL) | HF_CHECKED | set(HF_CONFIG) == covered


def test_missing_size_is_refused():
    cfg = {k: v for k, v in tiny_config_json(8192).items() if k != "num_key_value_heads"}
    expect_error(lambda: config_from_hf(cfg, "config.json"), "no 'num_key_value_heads'")


def test_qwen2_config_is_refused(tmp_path):
    """Qwen2 is Llama's shape with q/k/v biases: refused by its model_type and architectures, its
    switched-off window not being a problem. Relabeled as Llama, its biases are refused: stated in
    config.json (attention_bias), or present in the weights."""
    with pytest.raises(ValueError) as e:
        config_from_hf(QWEN2_5_0_5B, "config.json")
    assert "model_type='qwen2'" in str(e.value)
    assert "architectures=['Qwen2ForCausalLM']" in str(e.value)
    assert "sliding_window" not in str(e.value) and "use_mrope" not in str(e.value)
    relabeled = {**QWEN2_5_0_5B, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    assert config_from_hf(relabeled, "config.json").n_kv_heads == 2  # the shape itself is Llama's
    expect_error(lambda: config_from_hf({**relabeled, "attention_bias": True}, "config.json"),
                 "attention_bias=True")
    ref = tiny_llama()
    biased = {**to_hf(ref), "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}
    save_hf(biased, tmp_path / "biased", tiny_config_json(8192), sharded=False)
    expect_error(lambda: load_hf_checkpoint(tmp_path / "biased"), "q_proj.bias")


# -----------------------------------------------------------------------------
# keys the loader does not know


def test_unknown_keys_give_one_line_and_load(tmp_path, capsys):
    ref = tiny_llama()
    cfg = {**tiny_config_json(8192), "my_converter_flag": True, "zz_note": "made by hand"}
    save_hf(to_hf(ref), tmp_path / "hf", cfg, sharded=False)
    capsys.readouterr()
    loaded = load_hf_checkpoint(tmp_path / "hf")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "ignored" in lines[0] and "config.json" in lines[0]
    assert "my_converter_flag, zz_note" in lines[0] and "strict_config=True" in lines[0]
    assert_same_model(loaded, ref)
    # the strict gate: an error naming every unknown key, from each entry point
    for load in (lambda: load_hf_checkpoint(tmp_path / "hf", strict_config=True),
                 lambda: load_llama(tmp_path / "hf", strict_config=True),
                 lambda: config_from_hf(cfg, "config.json", strict_config=True)):
        expect_error(load, "unknown key 'my_converter_flag'", "unknown key 'zz_note'")
    assert capsys.readouterr().out == ""


def test_unknown_key_does_not_hide_a_math_problem(capsys):
    cfg = {**tiny_config_json(8192), "my_converter_flag": 1, "attention_bias": True}
    expect_error(lambda: config_from_hf(cfg, "config.json"), "attention_bias=True")
    assert capsys.readouterr().out == ""  # refused: no "ignored" line for a load that failed
