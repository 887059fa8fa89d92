# SBD fine-tuning of Llama-3.2-1B (Instruct or base) on ONE GPU with 40 GB or more (A100 40/80 GB,
# H100, L40S 48 GB). Needs: the checkpoint directory as downloaded (HF's safetensors with
# original/tokenizer.model, or Meta's layout; tied embeddings are kept tied) and a JSONL file with
# one {"prompt": "...", "response": "..."} per line.
#
#   torchrun --standalone --nproc_per_node=1 train.py config/sbd_llama1b.py \
#       --init_from=/models/Llama-3.2-1B-Instruct --dataset=/data/pairs.jsonl
#   python sample.py --out_dir=out-sbd-llama1b --start="..."     (SBD against NTP, chat format)
# Resume with the same command plus --init_from=resume.
#
# Why torchrun with ONE process: FSDP2 over a single rank shards nothing, but it is train.py's
# mixed-precision path: fp32 master weights, gradients and AdamW state, bf16 compute. The plain
# one-GPU path (--fsdp=False, run with python) trains in pure bf16 instead, and there an AdamW step
# smaller than half a bf16 spacing is rounded away: at lr 1e-5 a weight of 0.02 (bf16 spacing
# 1.2e-4) never moves. A 1B model can afford fp32 state.
#
# Measured on one H200 (torch 2.11, random weights with these shapes, this config with 20 iterations
# of --gradient_accumulation_steps=1): peak 28.6 GB allocated (torch.cuda.max_memory_allocated, in
# the log line; the estimate below, ~37 GB, adds the CUDA context and allocator slack and rounds
# up), 324 ms per micro-step of 2 rows x 2 x 2048 tokens (25k tokens/s), so one iteration of 32
# micro-steps takes ~10.4 s: 2000 iterations ~5.8 h on an H200. The first iteration compiles
# flex_attention (~14 s).
# Memory, computed (saved activations counted on a CPU with autograd's saved-tensor hooks):
# P = 1,235,814,400 parameters (tied: the embedding matrix is also the output head, counted once),
# vocab V = 128256, dim 2048, 16 layers, FFN 8192.
#   weights fp32 (master)                         4 B x P =  4.9 GB
#   gradients fp32                                4 B x P =  4.9 GB
#   AdamW exp_avg + exp_avg_sq fp32               8 B x P =  9.9 GB
#   bf16 working copies (FSDP): root (embeddings 0.53 GB) + two blocks' 0.12 GB,
#     and their bf16 grads                                   ~1.5 GB
#   per row of the batch, seq_len L = 2048, so the SBD forward runs on 2L = 4096 tokens:
#     logits and loss: bf16 logits 2L x V x 2 B = 1.05 GB, their fp32 copy 2.1 GB and log-softmax
#       2.1 GB in the forward; in the backward the saved log-softmax 2.1 GB + two fp32 gradients
#       4.2 GB  ->  peak ~6.3 GB
#     activation checkpointing: one bf16 block input per layer, 16 x 2L x 2048 x 2 B = 0.27 GB
#     the block being recomputed in the backward: 110 KiB per token (q/k/v, fp32 rotary copies,
#       two 8192-wide FFN activations and their product, norms) x 4096 tokens = ~0.5 GB;
#       flex_attention stores no 2L x 2L scores
#     -> ~7 GB per row, almost all of it the 128k-token vocabulary (the SBD forward doubles it, as
#       it doubles L)
#   CUDA context and allocator slack                                ~2 GB
#   batch_size 2: 19.8 + 1.5 + 2 x 7 + 2 = ~37 GB (fits 40 GB);  80 GB: --batch_size=4 ~51 GB
#   (halve the accumulation steps to keep the batch).  Attention 'sdpa' instead of 'flex' would add
#   the math kernel's fp32 scores, 32 heads x 4096^2 x 4 B = 2.1 GB per row and layer: keep 'flex'.
# 24 GB GPUs: fp32 state alone is 19.8 GB. --fsdp=False (pure bf16: 9.9 GB of state) with
# --batch_size=1 needs ~19 GB but meets the rounding problem above unless the lr is much larger;
# --seq_len=1024 halves the activations.
#
# Time, estimated: 8 x P FLOPs per token with recomputation x 4096 tokens x 64 rows = 2.6 PFLOP per
# iteration, ~7 s at 40% of an H100's bf16 peak; measured 10.4 s on an H200 (25% of its peak).
out_dir = "out-sbd-llama1b"
init_from = "Llama-3.2-1B-Instruct"  # the checkpoint directory: set it on the command line
dataset = "pairs.jsonl"  # a .jsonl file selects train.py's Llama path: set it on the command line
seq_len = 2048  # tokens per row (chat prompt + response + padding); the SBD forward sees 2 x 2048
loss_on_answer_only = True  # instruction tuning: loss and noise on the response (+ <|eot_id|>) only
block_phase = "answer"  # noisy blocks start at a row's first response token, where decoding starts

# the paper's recipe (docs/method.md) at SFT scale: AdamW, lr 1e-5 as the paper's 3B SFT, 200 warmup
# iterations, cosine decay, k ~ U{2..16} once per step, the NTP term kept (Eq. 14). Not stated
# there, our choice (as the 8B config): decay to 0.1 x peak, betas (0.9, 0.95), weight decay 0.1,
# gradient clipping at 1.0. The paper's SBD runs are far longer (34k iterations of 2M tokens); this
# is a first run that shows SBD decoding, not its full budget.
ntp_iters = 0  # the model already predicts the next token; fine-tune with SBD only
sbd_iters = 2000  # 2000 x 131k tokens = 262M tokens
sbd_lr = 1e-5
warmup_iters = 200
min_lr_ratio = 0.1
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 1.0
k_min = 2
k_max = 16
ntp_weight = 1.0
batch_size = 2  # rows per micro-step (each one a 4096-token SBD forward): ~37 GB, see above
gradient_accumulation_steps = 32  # 2 rows x 32 x 2048 tokens = 131k tokens per step

# GPU settings
dtype = "bfloat16"  # compute dtype; the master weights stay fp32 (FSDP2's mixed precision)
fsdp = True  # one process under torchrun: mixed precision, nothing sharded (see above)
activation_checkpointing = True  # keep one block input per layer, recompute the rest in backward
attention = "flex"  # the (B, 4096, 4096) SBD mask as a flex_attention BlockMask (SDPA would fall
# back to its math kernel for a masked grouped-query forward, storing every layer's full scores)
compile = False  # flex_attention is compiled on its own either way

log_interval = 10
eval_interval = 250  # also writes ckpt_resume.pt (fp32 weights + AdamW state: ~16 GB on disk)
eval_iters = 8
report = False  # a benchmark's report: evaluate.py --benchmark after training, or report_args
