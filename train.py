"""
Pretrain a small GPT with next-token prediction, then fine-tune the same weights with Set Block Decoding.

    python train.py config/sbd_small.py                    # both stages + the Table-1 report, ~14 min on 2 CPU cores
    python train.py config/sbd_small.py --sbd_iters=500    # any setting can be overridden
    python train.py config/sbd_small.py --init_from=resume # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=8 train.py config/sbd_small.py   # DDP
    torchrun --standalone --nproc_per_node=8 train.py config/sbd_llama8b.py  # SBD fine-tuning of Llama-3.1-8B

Stage 1 (iterations [0, ntp_iters)) is ordinary NTP; its final weights are saved as out_dir/ckpt_ntp.pt,
the baseline. Stage 2 (the next sbd_iters iterations) fine-tunes them with the SBD loss (Eq. 14 of the
paper: NTP on the clean half + masked-token prediction on the noisy half) with a fresh optimizer and its
own warmup and cosine schedule, as one fine-tunes a pretrained checkpoint; saved as out_dir/ckpt_sbd.pt.
out_dir/ckpt_resume.pt holds everything needed to continue a run exactly.
"""

import dataclasses
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import torch
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

import sbd
from configurator import configure
from load_llama import find_tokenizer, init_mask_embedding, load_llama
from model import GPT, GPTConfig, Llama, LlamaConfig, autodetect_device, configure_optimizer, save_checkpoint
from task import CharTask, JsonlTask, check_same_data

# -----------------------------------------------------------------------------
# default config: the small addition-trace demo with the paper's choices where it has them (k ~ U{2..16}, no
# weight averaging); config/sbd_small.py, the recipe the README measures, changes several, each with why
out_dir = "out-sbd-small"
dataset = "addition"  # data/<dataset>/prepare.py makes the data on first use; or a .jsonl file (Llama, below)
init_from = "scratch"  # 'scratch', 'resume' (from out_dir/ckpt_resume.pt), or a Llama 3 checkpoint directory
# model (GPT-2 style)
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
# batches
batch_size = 64  # sequences per micro-step
sbd_batch_size = 0  # the SBD stage's, if different (0 = batch_size): half the rows buys twice the steps
gradient_accumulation_steps = 1
# stage 1: NTP pretraining
ntp_iters = 1200
ntp_lr = 2e-3
# stage 2: SBD fine-tuning
sbd_iters = 1700
sbd_lr = 2e-3
k_min = 2  # block size k ~ U{k_min, k_min + k_step, ..., k_max} per step (the paper: U{2..16}, k_step 1)
k_max = 16
k_step = 1
k_per_row = False  # False: one k per step, as the paper's 8B runs; True: one per row, every step sees every size
ema_decay = 0.0  # > 0: ckpt_sbd.pt holds an exponential moving average of the SBD stage's weights (not with fsdp)
ntp_weight = 1.0  # weight of the NTP term in Eq. 14; 0 = the paper's ablation without it
loss_on_answer_only = True  # both losses and the noise only on the completion, as in instruction tuning
block_phase = "answer"  # where noisy blocks start: 'answer' (the completion's start, like decoding), 'random', 'zero'
# optimizer (AdamW), per stage: linear warmup then cosine decay to min_lr_ratio * lr
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_iters = 100
min_lr_ratio = 0.1
# logging, evaluation, checkpoints
log_interval = 100
eval_interval = 500  # also writes ckpt_resume.pt
eval_iters = 4  # batches per loss estimate
halt_after = -1  # stop after this many iterations (time-boxed runs, tests); init_from=resume continues
report = True  # at the end: calibrate γ on val and print the Table-1 report on test (evaluate.py)
report_problems = 0  # val/test problems the report uses (0 = all; the end-to-end test uses a few)
# system
seed = 1337
device = ""  # '' = autodetect cuda -> mps -> cpu
dtype = "float32"  # 'float32', 'bfloat16' or 'float16' (autocast on cuda)
compile = False  # torch.compile: worth it on a GPU, slow to start on a CPU
# fine-tuning a pretrained Llama 3 (config/sbd_llama8b.py): init_from=<its directory>, dataset=<pairs>.jsonl
seq_len = 2048  # tokens per row of a .jsonl dataset: prompt, response, padding (the SBD forward sees 2 * seq_len)
attention = "sdpa"  # 'sdpa': dense (B, 2L, 2L) bool mask; 'flex' (CUDA): a flex_attention BlockMask of the same mask
activation_checkpointing = False  # Llama: recompute each block's activations in backward (less memory)
fsdp = False  # under torchrun: shard the model over the ranks (FSDP2: fp32 master weights, `dtype` compute)
# -----------------------------------------------------------------------------
config = configure(globals(), sys.argv[1:])
llama = dataset.endswith(".jsonl")  # prompt/response pairs fine-tune a Llama; data/<name> trains a small GPT
if init_from not in ("scratch", "resume") and not os.path.isdir(init_from):
    raise ValueError(f"init_from must be 'scratch', 'resume' or a Llama checkpoint directory, got {init_from!r}")
if llama and init_from == "scratch" or not llama and init_from not in ("scratch", "resume"):
    raise ValueError(f"dataset={dataset!r} with init_from={init_from!r}: a .jsonl dataset fine-tunes a Llama "
                     "(init_from=<its directory> or 'resume'), a data/ dataset trains a GPT ('scratch' or 'resume')")
if attention not in ("sdpa", "flex"):
    raise ValueError(f"attention must be 'sdpa' or 'flex', got {attention!r}")
if not 1 <= k_min <= k_max:
    raise ValueError(f"block sizes need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
if k_step < 1 or (k_max - k_min) % k_step:
    raise ValueError(f"k_step must be >= 1 and divide k_max - k_min (k runs from k_min to k_max in steps of k_step), "
                     f"got k_min={k_min}, k_max={k_max}, k_step={k_step}")
n_sizes = (k_max - k_min) // k_step + 1  # block sizes k_min, k_min + k_step, ..., k_max
if batch_size < 1 or sbd_batch_size < 0:
    raise ValueError(f"batch_size must be >= 1 and sbd_batch_size >= 0 (0 = batch_size), got {batch_size}, "
                     f"{sbd_batch_size}")
sbd_batch_size = sbd_batch_size or batch_size  # resolved once (the saved config keeps what the user wrote)
if block_phase not in ("answer", "random", "zero"):
    raise ValueError(f"block_phase must be 'answer', 'random' or 'zero', got {block_phase!r}")
if ntp_weight < 0 or ntp_iters < 0 or sbd_iters < 0:
    raise ValueError("ntp_weight, ntp_iters and sbd_iters must be >= 0")
if not 0 <= ema_decay < 1 or ema_decay and fsdp:
    raise ValueError(f"ema_decay must be in [0, 1) (0 = off) and is not supported with fsdp, got {ema_decay}")

# distributed setup: under torchrun each process trains on its own batches, gradients are averaged
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
else:
    rank, world_size = 0, 1
    device = device or autodetect_device()
master = rank == 0
device_type = "cuda" if device.startswith("cuda") else device
if fsdp and not (ddp and llama):
    raise ValueError("fsdp=True shards a Llama over the processes of torchrun (one process: fsdp=False)")
if attention == "flex" and device_type != "cuda":
    raise ValueError("attention='flex' needs CUDA (flex_attention has no backward on a CPU): use 'sdpa'")
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
autocast = nullcontext() if device_type != "cuda" or dtype == "float32" else torch.autocast("cuda", ptdtype)
scaler = torch.amp.GradScaler(enabled=(dtype == "float16"))
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(seed + rank)

# data: fixed-length rows, the completion starts at task.prompt_len in every row (a .jsonl's: where `answer` says)
resume_path = os.path.join(out_dir, "ckpt_resume.pt")
if llama:  # tokenised by the Llama's own tokenizer, found next to its weights or recorded in the resume checkpoint
    tokenizer_path = (find_tokenizer(init_from) if init_from != "resume" else
                      torch.load(resume_path, map_location="cpu", mmap=True, weights_only=True)["tokenizer"]["path"])
    task = JsonlTask(dataset, tokenizer_path, seq_len)
else:
    task = CharTask(dataset)
data = {split: task.training_tensors(split, loss_on_answer_only) for split in ("train", "val")}
L = task.seq_len


def get_batch(split, generator, rows):
    x, y, answer = data[split]
    ix = torch.randint(len(x), (rows,), generator=generator)
    return x[ix].to(device), y[ix].to(device), answer[ix].to(device)


def block_phases(answer, k, generator):
    """(B,) position where noisy blocks start, mod k (an int, or (B,) per row; see sbd.sbd_training_mask);
    answer (B, L) bool."""
    if block_phase == "answer":  # decoding starts its first block right after the prompt
        return answer.int().argmax(dim=1) % k  # the first answer position of each row
    if block_phase == "random":  # uniform in 0..k-1, per row
        return (torch.rand(len(answer), generator=generator).to(answer.device) * k).long()
    return torch.zeros(len(answer), dtype=torch.long, device=answer.device)


def forward_loss(model, stage, x, y, answer, k, generator):
    """-> (loss to optimise, NTP loss, masked-token loss or None) for one batch."""
    if stage == "ntp":
        _, loss = model(x, y)
        return loss, loss.detach(), None
    maskable = answer if loss_on_answer_only else None
    idx, pos, mask, labels = sbd.sbd_inputs(x, y, task.mask_id, k, block_phases(answer, k, generator).to(device),
                                            maskable, generator, flex=attention == "flex")  # (B, T), mask (B, T, T)
    logits, _ = model(idx, pos=pos, mask=mask)  # (B, T, vocab), T = 2L - the noisy prompt nothing reads
    return sbd.sbd_loss(logits, labels, L, ntp_weight)


# model: a small GPT from scratch, or a pretrained Llama (in `dtype` on CUDA; fp32 master weights under FSDP)
llama_dtype = ptdtype if device_type == "cuda" and not fsdp else torch.float32
if llama and init_from != "resume":
    model, _ = load_llama(init_from, device, llama_dtype)
    init_mask_embedding(model, task.mask_id)  # <|reserved_special_token_0|>'s row was never trained
    model_args = dataclasses.asdict(model.config)
elif llama:  # resuming: the architecture from the checkpoint, its weights below
    model_args = torch.load(resume_path, map_location="cpu", mmap=True, weights_only=True)["model_args"]
    with torch.device(device):
        model = Llama(LlamaConfig(**model_args)).to(llama_dtype)
else:
    model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=L, vocab_size=task.vocab_size,
                      dropout=dropout, bias=bias)
    model = GPT(GPTConfig(**model_args)).to(device)
if llama and model.config.vocab_size != task.vocab_size:
    raise ValueError(f"the tokenizer has {task.vocab_size} tokens, the model {model.config.vocab_size}")
model.activation_checkpointing = activation_checkpointing  # a Llama switch (GPT has none)
print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, device {device}")

iter_num, stage = 0, "ntp" if ntp_iters > 0 else "sbd"
checkpoint = ema = None  # ema: {parameter name: its moving average} in the SBD stage when ema_decay > 0
if init_from == "resume":
    if not os.path.exists(resume_path):
        raise FileNotFoundError(f"init_from=resume but there is no {resume_path}; start with init_from=scratch")
    checkpoint = torch.load(resume_path, map_location="cpu", mmap=True, weights_only=True)
    if checkpoint["model_args"] != model_args:
        raise ValueError(f"{resume_path} was made with model {checkpoint['model_args']}, this config asks for "
                         f"{model_args}; use the run's original config")
    check_same_data(checkpoint, task, resume_path)
    model.load_state_dict(checkpoint["model"])
    iter_num, stage = checkpoint["iter_num"], checkpoint["stage"]
    if ema_decay and "ema" in checkpoint:  # cloned: the checkpoint's tensors are memory-mapped from its file
        ema = {name: average.clone() for name, average in checkpoint["ema"].items()}
raw_model = model
if compile:
    model = torch.compile(model)
if fsdp:  # parameters, gradients and optimizer state sharded over the ranks, one Llama block gathered at a time
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_optimizer_state_dict)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # gradients summed in fp32. The blocks' inputs are not cast: the rotary cos/sin stay fp32 (as without FSDP),
    # and activation checkpointing sees the same dtypes when it recomputes a block in backward (torch 2.11 cast
    # them in the forward but not in the recomputation, and the backward failed on the mismatch)
    mixed = MixedPrecisionPolicy(param_dtype=ptdtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for block in raw_model.layers:
        fully_shard(block, mp_policy=mixed)
    fully_shard(raw_model, mp_policy=mixed)
    FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # checkpoints: gathered into rank 0's memory
elif ddp:
    model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device_type == "cuda" else None)


def new_optimizer(stage):
    lr = ntp_lr if stage == "ntp" else sbd_lr
    return configure_optimizer(raw_model, weight_decay, lr, (beta1, beta2), device_type)


optimizer = new_optimizer(stage)
if checkpoint is not None and fsdp:  # the full state, keyed by parameter name: each rank keeps its shard
    set_optimizer_state_dict(raw_model, optimizer, checkpoint["optimizer"],
                             options=StateDictOptions(full_state_dict=True))
elif checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None  # free memory


def update_ema():
    """ema <- ema_decay * ema + (1 - ema_decay) * weights, after every SBD step. With a decay of 0.998 the
    average spans the last ~500 steps (README Notes: EMA, what it gained and cost over seeds)."""
    with torch.no_grad():
        for name, p in raw_model.named_parameters():
            ema[name].lerp_(p.float(), 1 - ema_decay)


if stage == "sbd" and ema_decay and ema is None and iter_num > ntp_iters:
    raise ValueError(f"{resume_path} is in its SBD stage without a moving average; resume it with ema_decay=0")


def lr_at(it):
    """Linear warmup then cosine decay to min_lr_ratio * peak, restarted at the start of each stage."""
    peak, start, length = (ntp_lr, 0, ntp_iters) if it < ntp_iters else (sbd_lr, ntp_iters, sbd_iters)
    it -= start
    if it < warmup_iters:
        return peak * (it + 1) / (warmup_iters + 1)
    progress = min(1.0, (it - warmup_iters) / max(1, length - warmup_iters))
    return peak * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def estimate_losses():
    """Mean NTP loss and masked-token loss (k = 8) per split, on the same batches every time."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        generator = torch.Generator().manual_seed(seed)
        ntp, mtp = [], []
        for _ in range(eval_iters):
            batch = get_batch(split, generator, batch_size)
            with autocast:
                _, ntp_loss, mtp_loss = forward_loss(raw_model, "sbd", *batch, min(8, k_max), generator)
            ntp.append(ntp_loss.item())
            mtp.append(mtp_loss.item())
        out[split] = (sum(ntp) / len(ntp), sum(mtp) / len(mtp))
    if fsdp:  # without a backward, FSDP leaves the root's parameters gathered: shard them again
        raw_model.reshard()
    model.train()
    return out


def stage_checkpoint(extra=None):
    """A self-contained checkpoint sample.py / evaluate.py can load (no optimizer).
    Under FSDP every rank must call this (it gathers the shards); only rank 0's holds the weights."""
    model_state = get_model_state_dict(raw_model, options=FULL) if fsdp else raw_model.state_dict()
    return dict(model=model_state, model_family="llama" if llama else "gpt", model_args=model_args, config=config,
                tokenizer=task.tokenizer_info, dataset=dataset, data_version=task.data_version, iter_num=iter_num,
                **(extra or {}))


def save_stage(name, sbd_meta):
    """out_dir/ckpt_<name>.pt, written by rank 0 (under FSDP every rank must call this)."""
    checkpoint = stage_checkpoint(dict(sbd=sbd_meta))
    if master:
        save_checkpoint(checkpoint, os.path.join(out_dir, f"ckpt_{name}.pt"))


def save_resume():
    """Under FSDP every rank must call this; the optimizer state is saved whole, keyed by parameter name."""
    optimizer_state = get_optimizer_state_dict(raw_model, optimizer, options=FULL) if fsdp else optimizer.state_dict()
    checkpoint = dict(stage_checkpoint(), stage=stage, optimizer=optimizer_state, **({"ema": ema} if ema else {}))
    if master:
        save_checkpoint(checkpoint, resume_path)


# training loop
total_iters = ntp_iters + sbd_iters
log_path = os.path.join(out_dir, "log.jsonl")
t0 = time.time()
while iter_num < total_iters:
    if stage == "ntp" and iter_num >= ntp_iters:  # stage 1 done: keep its weights as the NTP baseline
        save_stage("ntp", None)
        if master:
            print(f"saved the NTP baseline to {out_dir}/ckpt_ntp.pt; starting SBD fine-tuning")
        stage, optimizer = "sbd", new_optimizer("sbd")
    if stage == "sbd" and ema_decay and ema is None:  # the average starts at the SBD stage's first weights
        ema = {name: p.detach().float().clone() for name, p in raw_model.named_parameters()}

    if iter_num % eval_interval == 0 and (master or fsdp) and iter_num > 0:  # FSDP: every rank takes part
        losses = estimate_losses()
        if master:
            print(f"iter {iter_num}: NTP loss train {losses['train'][0]:.4f} val {losses['val'][0]:.4f} | "
                  f"masked-token loss (k=8) train {losses['train'][1]:.4f} val {losses['val'][1]:.4f}")
        save_resume()

    lr = lr_at(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    # every random draw of a step (batch, k, noise, dropout) is a function of (seed, rank, iter_num) alone,
    # so a resumed run, on any number of ranks, draws exactly what an uninterrupted run would have
    rng = torch.Generator().manual_seed(hash((seed, rank, iter_num)) % 2**63)
    torch.manual_seed(hash((seed, rank, iter_num, 1)) % 2**63)
    rows = batch_size if stage == "ntp" else sbd_batch_size
    k = k_min + k_step * torch.randint(0, n_sizes, (rows if k_per_row else 1,), generator=rng)  # (B,) or one k
    k = k.to(device) if k_per_row else int(k)  # SBD.md step 2 draws one per step
    for micro_step in range(gradient_accumulation_steps):
        if ddp and not fsdp:  # only synchronise gradients on the last micro-step (FSDP reduces them every time)
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with autocast:
            loss, ntp_loss, mtp_loss = forward_loss(model, stage, *get_batch("train", rng, rows), k, rng)
        scaler.scale(loss / gradient_accumulation_steps).backward()
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if ema is not None:
        update_ema()

    if iter_num % log_interval == 0 and master:
        dt = (time.time() - t0) / (log_interval if iter_num > 0 else 1)
        t0 = time.time()
        tokens = rows * gradient_accumulation_steps * world_size * L * (1 if stage == "ntp" else 2)
        k_text = "per row" if k_per_row else k
        mtp_text = f", masked-token {mtp_loss.item():.4f} (k={k_text})" if mtp_loss is not None else ""
        # the configs' memory estimates are checked against this: the most this process has held on its GPU so far
        memory_text = f", peak {torch.cuda.max_memory_allocated() / 1e9:.1f} GB" if device_type == "cuda" else ""
        print(f"iter {iter_num} [{stage}]: loss {loss.item():.4f} (NTP {ntp_loss.item():.4f}{mtp_text}), "
              f"lr {lr:.2e}, {dt * 1000:.0f} ms/iter, {tokens / dt:,.0f} tokens/s{memory_text}")
        with open(log_path, "a") as f:
            f.write(json.dumps(dict(iter=iter_num, stage=stage, loss=loss.item(), k=None if k_per_row else k,
                                    rows=rows)) + "\n")
    iter_num += 1
    if iter_num == halt_after:
        break

if master or fsdp:  # under FSDP every rank helps gather the checkpoints, rank 0 writes them
    save_resume()
    if iter_num == total_iters:
        if ntp_iters == total_iters:  # NTP only
            save_stage("ntp", None)
        else:  # a Llama starts from the paper's chat γ values; evaluate.py calibrates the small tasks' own
            sbd_meta = dict(mask_id=task.mask_id, stop_ids=task.stop_ids, k=16, gamma_low=0.35 if llama else None,
                            gamma_high=0.6 if llama else None)
            if ema is not None:  # the SBD model is the average (ckpt_resume.pt above kept the last weights)
                with torch.no_grad():
                    for name, p in raw_model.named_parameters():
                        p.copy_(ema[name])
            save_stage("sbd", sbd_meta)
            if master:
                print(f"saved the SBD model to {out_dir}/ckpt_sbd.pt")
            if report and master and not llama:  # the Table-1 report grades the small tasks' answers
                import evaluate
                evaluate.report(out_dir, device=device, max_problems=report_problems or None)
    elif master:
        print(f"halted after iteration {iter_num}; continue with --init_from=resume")
if ddp:  # wait for rank 0's checkpoint writing first: a rank that tears gloo down early can abort the others
    barrier()
    destroy_process_group()
    # and leave without the interpreter's own teardown: there gloo (torch 2.13, CPU) can still hit std::terminate
    # in a thread it joins, about one run in eight on a busy 2-core machine, after everything above is saved
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
