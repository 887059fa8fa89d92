# SBD fine-tuning of Llama-3.1-8B (Instruct or base) on your own prompt/response pairs, on GPUs.
# Needs: the checkpoint directory as downloaded (Meta's original/ layout or HF's safetensors,
# tokenizer.model next to the weights or under original/), and a JSONL file with one
# {"prompt": "...", "response": "..."} per line.
#
# 8 GPUs (the recipe below; FSDP2: fp32 master weights sharded over the GPUs, bf16 compute):
#   torchrun --standalone --nproc_per_node=8 train.py config/sbd_llama8b.py \
#       --init_from=/models/Meta-Llama-3.1-8B-Instruct --dataset=/data/pairs.jsonl
# 1 GPU: not recommended for 8B. Without FSDP, train.py keeps weights, gradients and AdamW state in
# bf16 (64 GB, fits an H200), but an AdamW step under half a bf16 spacing is rounded away: at a
# small-batch lr like 1e-5 a weight of 0.02 (bf16 spacing 1.2e-4) never moves, and the run only
# looks like training. fp32 master state (torchrun --nproc_per_node=1 with fsdp=True, as
# config/sbd_llama1b.py does) needs 16 B x 8.03B = 128 GB before activations: more than one GPU
# holds. On one GPU, fine-tune Llama-3.2-1B or 3B (config/sbd_llama1b.py).
# Then decode with the chat format, SBD against NTP:
#   python sample.py --out_dir=out-sbd-llama8b --start="..."
# Resume with the same command plus --init_from=resume (the tokenizer path is in the checkpoint).
#
# Checkpoints: under FSDP every rank sends its shards to rank 0's CPU memory, which writes one
# ordinary file (ckpt_sbd.pt with fp32 weights, 32 GB; ckpt_resume.pt adds the whole AdamW state,
# 96 GB: rank 0's host needs that much free memory). The 8-GPU resume must use FSDP again: its
# optimizer state is keyed by parameter name.
out_dir = "out-sbd-llama8b"
init_from = "Meta-Llama-3.1-8B-Instruct"  # the checkpoint directory: set it on the command line
dataset = "pairs.jsonl"  # a .jsonl file selects train.py's Llama path: set it on the command line
seq_len = 2048  # tokens per row (chat prompt + response + padding); the SBD forward sees 2 x 2048
loss_on_answer_only = True  # instruction tuning: loss and noise on the response (+ <|eot_id|>) only
block_phase = "answer"  # noisy blocks start at a row's first response token, where decoding starts

# the paper's 8B recipe (docs/method.md): AdamW, peak lr 3e-4, 200 warmup iterations, cosine decay,
# ~2M-token batches, k ~ U{2..16} once per step, the NTP term kept (Eq. 14). Not stated there, our
# choice: decay to 0.1 x peak, betas (0.9, 0.95), weight decay 0.1 and gradient clipping at 1.0, as
# in Llama pretraining.
ntp_iters = 0  # the model already predicts the next token; fine-tune with SBD only
sbd_iters = 2000  # the paper ran 34k (70B tokens); 2000 x 2.1M = 4.2B tokens, ~2 days on 8 H100s
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
# a low-rank delta that only the block's slots see (168M parameters at rank 64 on every layer),
# so NTP decoding stays Llama-3.1-8B's own. Frozen in bf16 on one GPU (--fsdp=False) it needs
# 16 GB of weights + 2.7 GB of adapter state before activations: one 80 GB GPU (train.py prints
# the estimate at start). A LoRA wants a higher lr than a full fine-tune (e.g. 1e-3).
adapter_rank = 0  # 0: every weight trains (the paper)
batch_size = 2  # rows per GPU per micro-step (each one a 4096-token SBD forward)
gradient_accumulation_steps = 64  # 8 GPUs x 2 rows x 64 x 2048 tokens = 2.1M tokens per step

# GPU settings
dtype = "bfloat16"
fsdp = True  # torchrun only (fsdp=False: pure bf16 weights and AdamW state, see the 1-GPU note)
activation_checkpointing = True  # keep one block input per layer, recompute the rest in backward
attention = "flex"  # the (B, 4096, 4096) SBD mask as a flex_attention BlockMask: SDPA with a dense
# mask and grouped-query attention falls back to its math kernel, storing every layer's full scores
compile = False  # flex_attention is compiled on its own either way

log_interval = 10
eval_interval = 250  # also writes ckpt_resume.pt
eval_iters = 8
report = False  # a benchmark's report: evaluate.py --benchmark after training, or report_args
