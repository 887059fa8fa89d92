"""
Check load_llama's Qwen-3 path against transformers' Qwen3ForCausalLM at Qwen3-8B's widths: hidden
4096, 32 query heads and 8 K/V heads of head_dim 128, FFN 12288, rope_theta 1e6, untied head; 2
layers and a 1024-token vocabulary instead of 36 and 151936, to keep memory near 5 GB. The weights
are random (none are downloaded), norms included; transformers writes the checkpoint with
save_pretrained in 1 GB shards, and load_llama reads it. Run by hand from the repository root;
nothing imports it and the project does not need transformers:

    pip install transformers
    python checks/qwen3_vs_transformers.py

It prints, in fp32 on the CPU: the largest |logit difference| on a (2, 64) batch (goal: under 1e-4)
and whether 32 greedy tokens agree (each model on its own KV cache).

Measured on an "Intel(R) Xeon(R) Processor" (lscpu), 2 cores, torch 2.13.0+cpu, transformers
5.24.0: 2 shards, max |logit diff| 9.78e-06 (logits up to 6.77), 32 greedy tokens identical.
"""

import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pretrained.load_llama import load_llama  # noqa: E402
from sampling import DecodeSettings  # noqa: E402
from serving import batched  # noqa: E402

QWEN3_8B_WIDTHS = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, intermediate_size=12288, rope_theta=1e6, rms_norm_eps=1e-6,
                       max_position_embeddings=40960, tie_word_embeddings=False)


def main():
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=1024, num_hidden_layers=2, **QWEN3_8B_WIDTHS)
    theirs = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_((0.1 if p.dim() == 1 else 0.01) * torch.randn_like(p))
    with tempfile.TemporaryDirectory() as directory:
        theirs.save_pretrained(directory, max_shard_size="1GB")
        shards = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        ours, _ = load_llama(directory, strict_config=True)
        ours.eval()
        idx = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = theirs(idx).logits
            got, _ = ours(idx)
            diff = (got - want).abs().max().item()
            scale = want.abs().max().item()
            greedy_theirs = theirs.generate(idx[:1, :16], max_new_tokens=32, min_new_tokens=32,
                                            do_sample=False, pad_token_id=0)[0, 16:].tolist()
        greedy_ours, _ = batched.ntp_generate(ours, idx[:1, :16], DecodeSettings(mask_id=None), 32)
    print(f"Qwen3-8B widths, 2 layers, {len(shards)} shards: head_dim {ours.config.head_dim}, "
          f"qk_norm {ours.config.qk_norm}")
    print(f"max |logit diff| {diff:.2e} (logits up to {scale:.2f}); goal < 1e-4: "
          f"{'ok' if diff < 1e-4 else 'FAILED'}")
    same = greedy_ours[0] == greedy_theirs
    print(f"32 greedy tokens {'identical' if same else 'DIFFER'}: {greedy_ours[0][:8]}...")


if __name__ == "__main__":
    main()
