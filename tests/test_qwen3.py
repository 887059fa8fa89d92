"""Qwen-3 through the Llama path, on tiny random checkpoints (no Qwen-3 weights exist offline).

Without transformers: QK-norm and an explicit head_dim against a forward written out here in HF's
layout (rotate_half pairs), through an HF directory written with write_safetensors; Llama stays
without the new parameters; every refused Qwen-3 setting has its refusal; a GGUF written the way
llama.cpp's converter writes Qwen-3 gives the same logits; train.py SBD-fine-tunes a tiny Qwen-3
directory (with a tokenizer.json), and exact SBD == greedy NTP on it (cached SBD == uncached:
tests/hidden/test_hidden_qwen3.py).
With transformers (skipped without): a Qwen3ForCausalLM saved by save_pretrained (tied, head_dim
32 != 64 / 4, grouped queries, 3 layers, sharded) loads to logits within 1e-4 of its own, and 32
greedy tokens are identical. checks/qwen3_vs_transformers.py does the same at Qwen3-8B's widths."""

import json

import pytest
import torch
import torch.nn.functional as F
from test_hf_config import expect_error
from test_llama_sbd import PAIRS, run

import sampling
import tiny_models
from checkpoint import load_checkpoint
from model import Llama, LlamaConfig
from pretrained.load_llama import config_from_hf, hf_permute, load_llama, write_safetensors
from pretrained.loading import load_pretrained
from pretrained.tokenizer import QWEN2_PAT_STR, gpt2_byte_chars
from serving import exact

VOCAB = 512  # 256 bytes, 3 added tokens, then spare embedding rows (the first: SBD's mask, 259)
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MASK = 259


def tiny_config_json(**changes):
    """A Qwen-3 config.json as transformers 4.x writes it: head_dim 32 != 64 / 4 heads."""
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
           "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "num_hidden_layers": 3, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
           "rope_scaling": None, "vocab_size": VOCAB, "max_position_embeddings": 512,
           "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
           "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
           "max_window_layers": 3, "torch_dtype": "float32", "bos_token_id": 256,
           "eos_token_id": 258, "use_cache": True, "transformers_version": "4.51.0"}
    return {**cfg, **changes}


def random_hf_state(cfg, seed=0):
    """{HF name: tensor} of a random Qwen-3 (norms away from 1), tied: no lm_head.weight."""
    g = torch.Generator().manual_seed(seed)
    hd, d, f = cfg["head_dim"], cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (nh * hd, d), p + "self_attn.o_proj.weight":
                   (d, nh * hd), p + "self_attn.k_proj.weight": (nkv * hd, d),
                   p + "self_attn.v_proj.weight": (nkv * hd, d), p + "self_attn.q_norm.weight":
                   (hd,), p + "self_attn.k_norm.weight": (hd,), p + "mlp.gate_proj.weight":
                   (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
                   p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)}
    return {name: (1.0 if len(s) == 1 else 0.0) + 0.3 * torch.randn(s, generator=g)
            for name, s in shapes.items()}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@torch.no_grad()
def reference_logits(state, cfg, idx):
    """Qwen-3's forward as transformers computes it, in HF's layout: q_norm / k_norm per head
    before rotate_half RoPE, grouped queries, tied head. idx (B, T) -> (B, T, vocab)."""
    B, T = idx.shape
    hd, eps, nh, nkv = (cfg[k] for k in ("head_dim", "rms_norm_eps", "num_attention_heads",
                                          "num_key_value_heads"))
    inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.arange(T)[:, None] * inv_freq.float()  # (T, hd/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (T, hd)
    x = state["model.embed_tokens.weight"][idx]
    for i in range(cfg["num_hidden_layers"]):
        w = {k.removeprefix(f"model.layers.{i}."): v for k, v in state.items()
             if k.startswith(f"model.layers.{i}.")}
        h = rms_norm(x, w["input_layernorm.weight"], eps)
        q = (h @ w["self_attn.q_proj.weight"].T).view(B, T, nh, hd)
        k = (h @ w["self_attn.k_proj.weight"].T).view(B, T, nkv, hd)
        v = (h @ w["self_attn.v_proj.weight"].T).view(B, T, nkv, hd).transpose(1, 2)
        q = rms_norm(q, w["self_attn.q_norm.weight"], eps).transpose(1, 2)  # (B, nh, T, hd)
        k = rms_norm(k, w["self_attn.k_norm.weight"], eps).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        x = x + y.reshape(B, T, -1) @ w["self_attn.o_proj.weight"].T
        h = rms_norm(x, w["post_attention_layernorm.weight"], eps)
        gate, up = h @ w["mlp.gate_proj.weight"].T, h @ w["mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w["mlp.down_proj.weight"].T
    return rms_norm(x, state["model.norm.weight"], eps) @ state["model.embed_tokens.weight"].T


def write_tokenizer_json(directory):
    """A byte-level tokenizer.json (the 256 bytes, no merges, Qwen's split regex and NFC) with
    ChatML's added tokens at 256..258, and tokenizer_config.json naming end of text and padding."""
    chars = gpt2_byte_chars()
    added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(ADDED)]
    spec = {"version": "1.0", "added_tokens": added, "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PAT_STR}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {chars[b]: b for b in range(256)}, "merges": []}}
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def write_qwen3_dir(directory, cfg=None, seed=0):
    cfg = cfg or tiny_config_json()
    directory.mkdir(parents=True)
    state = random_hf_state(cfg, seed)
    (directory / "config.json").write_text(json.dumps(cfg))
    write_safetensors(state, directory / "model.safetensors")
    write_tokenizer_json(directory)
    return state


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen3") / "Qwen3-tiny"
    return directory, write_qwen3_dir(directory)


IDX = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))


# -----------------------------------------------------------------------------
# the model and its loader, without transformers


def test_qk_norm_and_head_dim_match_a_reference_in_hf_layout(qwen3_dir):
    directory, state = qwen3_dir
    model, info = load_llama(directory, strict_config=True)
    c = model.config
    assert (c.qk_norm, c.head_dim, c.dim // c.n_heads, c.tie_word_embeddings) == (
        True, 32, 16, True)
    assert model.layers[0].attention.wq.weight.shape == (4 * 32, 64)
    assert model.layers[0].attention.q_norm.weight.shape == (32,)
    assert info["tokenizer_path"] == str(directory / "tokenizer.json")
    with torch.no_grad():
        got, _ = model.eval()(IDX)
    assert (got - reference_logits(state, tiny_config_json(), IDX)).abs().max() < 1e-4
    # the norm weights move with the q/k rows: left in HF's order, the logits change
    wrong = {**state, "model.layers.0.self_attn.q_norm.weight":
             hf_permute(state["model.layers.0.self_attn.q_norm.weight"][:, None], 1)[:, 0]}
    assert (reference_logits(wrong, tiny_config_json(), IDX) - got).abs().max() > 1e-3


def test_cached_decoding_with_qk_norm_equals_a_full_forward(qwen3_dir):
    model, _ = load_llama(qwen3_dir[0])
    cache = model.eval().new_cache(2, 24, "cpu")
    with torch.no_grad():
        full, _ = model(IDX)
        first, _ = model(IDX[:, :20], cache=cache)
        rest = [model(IDX[:, t:t + 1], cache=cache)[0] for t in range(20, 24)]
    assert (torch.cat([first, *rest], 1) - full).abs().max() < 1e-4


def test_llama_gains_no_parameters_and_head_size_is_explicit():
    llama = Llama(LlamaConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=32))
    assert llama.config.head_dim == 16
    assert not any("norm" in name for name in dict(llama.layers[0].attention.named_parameters()))
    wide = Llama(LlamaConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=32,
                             head_size=24, qk_norm=True))
    shapes = {n: tuple(p.shape) for n, p in wide.layers[0].attention.named_parameters()}
    assert shapes == {"wq.weight": (96, 64), "wk.weight": (48, 64), "wv.weight": (48, 64),
                      "wo.weight": (64, 96), "q_norm.weight": (24,), "k_norm.weight": (24,)}
    assert wide.inv_freq.shape == (12,)
    assert wide(torch.tensor([[1, 2, 3]]))[0].shape == (1, 3, 32)


def test_config_defaults_and_transformers_5_form():
    no_head_dim = {k: v for k, v in tiny_config_json().items() if k != "head_dim"}
    assert config_from_hf(no_head_dim, "config.json").head_dim == 128  # Qwen3Config's default
    v5 = {k: v for k, v in tiny_config_json().items() if k not in ("rope_theta", "rope_scaling")}
    v5 |= {"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "dtype": "float32",
           "layer_types": ["full_attention"] * 3}
    assert config_from_hf(v5, "config.json", strict_config=True) == config_from_hf(
        tiny_config_json(), "config.json")


REFUSED = [  # (change to the tiny Qwen-3's config.json, what the error names)
    ({"use_sliding_window": True}, "use_sliding_window=True"),
    ({"use_sliding_window": True, "sliding_window": 4096}, "sliding_window=4096"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128},
     "model_type='qwen3_moe'"),
    ({"model_type": "qwen3_moe"}, "model_type='qwen3_moe'"),
    ({"architectures": ["LlamaForCausalLM"]}, "architectures=['LlamaForCausalLM'] with "
                                              "model_type='qwen3'"),
    ({"model_type": "llama"}, "architectures=['Qwen3ForCausalLM'] with model_type='llama'"),
    ({"head_dim": 33}, "head_dim=33"), ({"head_dim": None}, "head_dim=None"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 32768}}, "'yarn'"),
    ({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "layer_types"),
]


@pytest.mark.parametrize("change,phrase", REFUSED, ids=lambda x: repr(x)[:40])
def test_refused_qwen3_settings(change, phrase):
    expect_error(lambda: config_from_hf(tiny_config_json(**change), "config.json"),
                 "config.json: unsupported config.json", phrase)


def test_a_refused_setting_stops_the_loader(tmp_path):
    write_qwen3_dir(tmp_path / "biased", tiny_config_json(attention_bias=True))
    expect_error(lambda: load_llama(tmp_path / "biased"), "attention_bias=True")


# -----------------------------------------------------------------------------
# SBD on the tiny Qwen-3: training, then cached == uncached and exact == NTP


@pytest.mark.slow
def test_train_py_fine_tunes_a_tiny_qwen3(qwen3_dir, tmp_path):
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    model, tokenizer = load_pretrained(str(qwen3_dir[0]))
    assert (tokenizer.mask_id, tokenizer.eot_id, tokenizer.pad_id, tokenizer.vocab_size) == (
        MASK, 258, 256, VOCAB)
    assert tokenizer.encode_chat([{"role": "user", "content": "Hi"}]) == [
        257, *b"user\nHi", 258, *b"\n", 257, *b"assistant\n"]
    out_dir = tmp_path / "out"
    log = run("train.py", "config/sbd_qwen3_8b.py", f"--init_from={qwen3_dir[0]}",
              f"--dataset={tmp_path / 'pairs.jsonl'}", f"--out_dir={out_dir}", "--device=cpu",
              "--dtype=float32", "--fsdp=False", "--attention=sdpa", "--seq_len=48",
              "--batch_size=2", "--gradient_accumulation_steps=1", "--sbd_iters=2",
              "--warmup_iters=1", "--eval_interval=1", "--eval_iters=1", "--log_interval=1")
    assert "iter 1 [sbd]" in log and "saved the SBD model" in log
    tuned, ckpt = load_checkpoint(str(out_dir / "ckpt_sbd.pt"))
    assert tuned.config.qk_norm and tuned.config.head_dim == 32 and ckpt["mask_id"] == MASK
    assert ckpt["tokenizer"] == dict(kind="hf", path=str(qwen3_dir[0] / "tokenizer.json"),
                                     n_rows=VOCAB)
    assert ckpt["stop_ids"] == [258, 256]


def random_qwen3(seed=0):
    """The tiny Qwen-3 in float64 with weights of std 0.5 (as test_decoding's models): peaked
    predictions that vary, and cached and uncached logits that agree to ~1e-12."""
    config = config_from_hf(tiny_config_json(vocab_size=64), "config.json")
    torch.manual_seed(seed)
    model = Llama(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.5 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("k", [4, 16])
def test_exact_sbd_equals_greedy_ntp_on_qwen3(k):
    rejected = 0
    for seed in range(2):
        m = random_qwen3(seed)
        prompt = torch.randint(0, 63, (1, 5), generator=torch.Generator().manual_seed(seed))
        ntp, _ = tiny_models.ntp(m, prompt, 24, mask_id=63)
        for gamma in (0.0, 0.1, 1e9):
            settings = sampling.DecodeSettings(mask_id=63, k=k, gamma=gamma, exact=True)
            out, stats = exact.exact_generate(m, prompt, settings, 24)
            assert out == ntp, f"seed {seed} γ={gamma}"
            rejected += stats.rejected[0]
    assert rejected > 0, "random drafts must really be rejected, or this checks nothing"


# -----------------------------------------------------------------------------
# against transformers' Qwen3ForCausalLM


def transformers_qwen3(directory, seed=0):
    """A tiny random Qwen3ForCausalLM saved by save_pretrained in two shards -> the model."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms away from 1, weights large enough to matter
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory, max_shard_size="100KB")
    return model


def test_logits_and_greedy_tokens_match_transformers(tmp_path):
    theirs = transformers_qwen3(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    ours, _ = load_llama(tmp_path / "hf", strict_config=True)
    ours.eval()
    idx = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(idx)[0] - theirs(idx).logits).abs().max().item()
    assert diff < 1e-4
    prompt = idx[:1, :8]
    with torch.no_grad():
        want = theirs.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32,
                               pad_token_id=0)[0, 8:].tolist()
    got, _ = tiny_models.ntp(ours, prompt, 32)
    assert got[0] == want


# -----------------------------------------------------------------------------
# GGUF: general.architecture qwen3, as llama.cpp's converter writes it


GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf_name):
    """HF name -> llama.cpp's, as its converter (Qwen2Model) maps Qwen-3's: no row permuted."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, i, module = hf_name.removesuffix(".weight").split(".", 3)
    return f"blk.{i}.{GGUF_LAYER[module]}.weight"


def test_gguf_of_qwen3_gives_the_hf_checkpoints_logits(tmp_path):
    gguf = pytest.importorskip("gguf")
    from test_gguf import write_gguf
    from test_gguf_tokenizer import TOKENS, tiny_tokenizer_metadata

    from pretrained.load_gguf import load_gguf

    cfg = tiny_config_json(vocab_size=len(TOKENS))
    state = write_qwen3_dir(tmp_path / "hf", cfg)
    tensors = {gguf_name(n): (t.numpy(), gguf.GGMLQuantizationType.F32) for n, t in state.items()}
    keys = {"block_count": 3, "context_length": 512, "embedding_length": 64,
            "feed_forward_length": 96, "attention.head_count": 4, "attention.head_count_kv": 2,
            "rope.freq_base": 1e6, "attention.layer_norm_rms_epsilon": 1e-6,
            "attention.key_length": 32, "attention.value_length": 32}
    metadata = {f"qwen3.{k}": v for k, v in keys.items()} | tiny_tokenizer_metadata(pre="qwen2")
    path = write_gguf(tmp_path / "qwen3.gguf", tensors, metadata, arch="qwen3")
    model, info = load_gguf(path)
    assert model.config.qk_norm and model.config.head_dim == 32
    want, _ = load_llama(tmp_path / "hf")
    idx = IDX % len(TOKENS)
    with torch.no_grad():
        assert (model.eval()(idx)[0] - want.eval()(idx)[0]).abs().max() < 1e-4
    assert info["tokenizer"].encode("x  12") == info["tokenizer"].encode("x  1") + [
        info["tokenizer"].encode("2")[0]]  # qwen2's split: each digit alone
    bad = write_gguf(tmp_path / "bad.gguf", tensors, metadata | {"qwen3.attention.key_length": 33},
                     arch="qwen3")
    # key_length sets the head width: value_length must agree, and rotary needs an even width
    expect_error(lambda: load_gguf(bad), "qwen3.attention.value_length = 32 (model.Llama needs 33)",
                 "head width 33")
