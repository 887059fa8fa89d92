"""
Models by shape name, built with random weights and no checkpoint: the published Llama 3 sizes
(benchmarks and memory checks at the real shapes) and tiny ones (tests).

    model = build_model("llama-tiny")   # or "gpt", "llama" with GPTConfig / LlamaConfig keywords
"""

from model import GPT, GPTConfig, Llama, LlamaConfig

GPT_PRESETS = {
    "gpt-tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=64),  # for tests
}

LLAMA_PRESETS = {
    "llama3.1-8b": dict(),  # LlamaConfig's defaults are Llama-3.1-8B's params.json
    # Llama 3.2: FFN 8192 in both; 1,235,814,400 (1B) and 3,212,749,824 (3B) parameters
    "llama3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
                        multiple_of=256, rope_scale_factor=32.0, tie_word_embeddings=True),
    "llama3.2-3b": dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim_multiplier=1.0,
                        multiple_of=256, rope_scale_factor=32.0, tie_word_embeddings=True),
    "llama-tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=320, multiple_of=32,
                       ffn_dim_multiplier=1.3, rope_original_context=64, max_seq_len=512),  # tests
}


def build_model(family, **overrides):
    """family 'gpt' or 'llama' (or a preset name) -> a randomly initialised model."""
    if family in GPT_PRESETS:
        return GPT(GPTConfig(**{**GPT_PRESETS[family], **overrides}))
    if family in LLAMA_PRESETS:
        return Llama(LlamaConfig(**{**LLAMA_PRESETS[family], **overrides}))
    if family == "gpt":
        return GPT(GPTConfig(**overrides))
    if family == "llama":
        return Llama(LlamaConfig(**overrides))
    known = ["gpt", "llama", *GPT_PRESETS, *LLAMA_PRESETS]
    raise ValueError(f"unknown model family {family!r}; choose one of {known}")
