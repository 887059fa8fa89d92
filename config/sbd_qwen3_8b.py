# SBD fine-tuning of Qwen3-8B (base or the hybrid-thinking chat model) on your own prompt/response
# pairs, on GPUs: the paper's second model. Qwen-3 runs through model.Llama (LlamaConfig.qk_norm,
# an explicit head_dim; docs/llama.md, Qwen-3). Needs: the checkpoint directory in HF's layout as
# downloaded (config.json, model-0000N-of-00005.safetensors + index, tokenizer.json and
# tokenizer_config.json), and a JSONL file with one {"prompt": "...", "response": "..."} per line.
# Rows are ChatML (<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n...<|im_end|>); SBD's
# mask token is embedding row 151669, the first of the 267 rows past the tokenizer's ids
# (pretrained/hf_tokenizer.py), which no text produces.
#
# 8 GPUs (FSDP2: fp32 master weights sharded over the GPUs, bf16 compute):
#   torchrun --standalone --nproc_per_node=8 train.py config/sbd_qwen3_8b.py \
#       --init_from=/models/Qwen3-8B --dataset=/data/pairs.jsonl
# 1 GPU: not for 8B, for the reason config/sbd_llama8b.py gives (bf16 AdamW steps round away; fp32
# master state is 16 B x 8.19B = 131 GB before activations).
# Then decode with the chat format, SBD against NTP:
#   python sample.py --out_dir=out-sbd-qwen3-8b --start="..."
# Resume with the same command plus --init_from=resume (the tokenizer path is in the checkpoint).
#
# Checkpoints as config/sbd_llama8b.py's: ckpt_sbd.pt holds fp32 weights (33 GB), ckpt_resume.pt
# adds the AdamW state (98 GB on rank 0's host).
out_dir = "out-sbd-qwen3-8b"
init_from = "Qwen3-8B"  # the checkpoint directory: set it on the command line
dataset = "pairs.jsonl"  # a .jsonl file selects train.py's Llama path: set it on the command line
seq_len = 2048  # tokens per row (chat prompt + response + padding); the SBD forward sees 2 x 2048
loss_on_answer_only = True  # instruction tuning: loss and noise on the response (+ <|im_end|>) only
block_phase = "answer"  # noisy blocks start at a row's first response token, where decoding starts

# the paper's 8B recipe (docs/method.md), as config/sbd_llama8b.py: AdamW, peak lr 3e-4, 200 warmup
# iterations, cosine decay, ~2M-token batches, k ~ U{2..16} once per step, the NTP term kept
# (Eq. 14). Not stated there, our choice: decay to 0.1 x peak, betas (0.9, 0.95), weight decay 0.1
# and gradient clipping at 1.0.
ntp_iters = 0  # the model already predicts the next token; fine-tune with SBD only
sbd_iters = 2000  # the paper ran 34k (70B tokens); 2000 x 2.1M = 4.2B tokens
sbd_lr = 3e-4  # the paper's 8B value, meant for 2M-token batches: lower it with the batch
warmup_iters = 200
min_lr_ratio = 0.1
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 1.0
k_min = 2
k_max = 16
ntp_weight = 1.0
# The block adapter (docs/method.md, Block adapter): adapter_rank=64 freezes the model and trains
# a low-rank delta that only the block's slots see, so NTP decoding stays the model's own; frozen
# in bf16 on one GPU (--fsdp=False) it fits one 80 GB GPU (train.py prints the estimate at start).
adapter_rank = 0  # 0: every weight trains (the paper)
batch_size = 2  # rows per GPU per micro-step (each one a 4096-token SBD forward)
gradient_accumulation_steps = 64  # 8 GPUs x 2 rows x 64 x 2048 tokens = 2.1M tokens per step

# GPU settings
dtype = "bfloat16"
fsdp = True  # torchrun only (fsdp=False: pure bf16 weights and AdamW state)
activation_checkpointing = True  # keep one block input per layer, recompute the rest in backward
attention = "flex"  # the (B, 4096, 4096) SBD mask as a flex_attention BlockMask (as for Llama)
compile = False  # flex_attention is compiled on its own either way

log_interval = 10
eval_interval = 250  # also writes ckpt_resume.pt
eval_iters = 8
report = False  # a benchmark's report: evaluate.py --benchmark after training, or report_args
