"""
Train with next-token prediction (NTP), then fine-tune the same weights with Set Block Decoding.

    python train.py config/sbd_small.py                      # the demo: both stages + Table 1
    python train.py config/sbd_small.py --sbd_iters=500      # any setting can be overridden
    python train.py config/sbd_small.py --init_from=resume   # continue exactly where a run stopped
    python train.py config/sbd_smollm2.py                    # a real model on a CPU (SmolLM2)
    torchrun --standalone --nproc_per_node=8 train.py config/sbd_llama8b.py   # Llama-3.1-8B, FSDP

Stage 1 (iterations [0, ntp_iters)) is ordinary NTP; its last weights are saved as
out_dir/ckpt_ntp.pt, the baseline. Stage 2 (the next sbd_iters iterations) fine-tunes them with the
SBD loss (Eq. 14: NTP on the clean half + masked-token prediction on the noisy half; sbd.py) with
a fresh optimizer and its own warmup and cosine schedule, as one fine-tunes a pretrained model;
saved as out_dir/ckpt_sbd.pt. With sbd_starts_from='init' stage 2 starts from init_from instead,
so that the two stages are the paper's Table 1 pair: an NTP and an SBD fine-tune of the same model
on the same data for the same steps. out_dir/ckpt_resume.pt holds what is needed to continue.
What a checkpoint holds: checkpoint.py.

The defaults are the demo's recipe, as config/sbd_small.py states it; docs/findings.md says why.
"""

import dataclasses
import functools
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import torch

import sbd
from checkpoint import adapter_alone, check_resumable, save_checkpoint, training_checkpoint
from configurator import ConfigError, check_training_settings, configure, pick_device, resolve_dtype
from model import (
    GPT,
    IGNORE_INDEX,
    GPTConfig,
    Llama,
    LlamaConfig,
    attach_adapter,
    configure_optimizer,
)
from pretrained.load_llama import with_mask_row
from pretrained.loading import load_pretrained, pretrained_path, tokenizer_of
from tasks import CharTask, JsonlTask, step_generator
from training import budget, parallel
from training.flex import flex_training_mask

# -----------------------------------------------------------------------------
# default config: the small addition-trace demo
out_dir = "out-sbd-small"
dataset = "addition"  # data/<name>/ (made by its prepare.py), or a .jsonl of chat pairs
init_from = "scratch"  # 'scratch', 'resume', or pretrained: a Llama 3 dir, .gguf, 'smollm2', .pt
# model (GPT-2 style)
n_layer = 4
n_head = 4
n_embd = 64
dropout = 0.0
bias = False
# batches
batch_size = 64  # sequences per micro-step in the NTP stage
sbd_batch_size = 32  # the SBD stage's (0 = batch_size): at equal compute more steps beat more rows
gradient_accumulation_steps = 1
# stage 1: NTP pretraining
ntp_iters = 1000
ntp_lr = 2e-3
# stage 2: SBD fine-tuning
sbd_starts_from = "ntp"  # 'ntp': stage 1's weights; 'init': init_from's, as stage 1 did
sbd_iters = 4500  # the masked-token path needs its own circuit: more steps than stage 1
sbd_lr = 2e-3
k_min = 8  # block size k ~ U{k_min..k_max} once per step (the paper: U{2..16}); it must cover
k_max = 16  # every offset of the decoded k = 8 and 16 often enough (docs/findings.md, Block sizes)
ntp_weight = 1.0  # weight of the NTP term in Eq. 14; 0 = the paper's ablation without it
token_shift = False  # block slots keep the pretrained next-token alignment (sbd.read_at)
complementary_masks = False  # two noisy copies per row, masks m and not-m (sbd.sbd_inputs)
all_masked_rows = 0.0  # this fraction of rows has its answer masked whole, as exact SBD drafts
# (sbd.add_noise); 0: the paper's rate η ~ U(0,1) per row
adapter_rank = 0  # 0: stage 2 fine-tunes every weight (the paper). r > 0: it freezes the NTP model
# and trains a block adapter of rank r that only the block's slots see (model.attach_adapter), so
# the SBD model's next-token path is the NTP model's exactly; its loss is the masked-token term
adapter_layers = "all"  # the block linear layers that carry the delta: 'all', 'attention', 'mlp'
adapter_only = False  # ckpt_sbd.pt holds the adapter alone; decoding reads its base, ckpt_ntp.pt
loss_on_answer_only = True  # both losses and the noise on the completion only, as in SFT
block_phase = "answer"  # noisy blocks start at: 'answer' (where decoding starts), 'random', 'zero'
head_at_labels = False  # logits only at labelled slots, both stages (a large vocabulary's head)
# optimizer (AdamW), per stage: linear warmup then cosine decay to min_lr_ratio * lr
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_iters = 100
min_lr_ratio = 0.01  # a quiet end leaves fewer confident mistakes (the paper does not say)
# logging, evaluation, checkpoints
log_interval = 100
eval_interval = 500  # also writes ckpt_resume.pt
eval_iters = 4  # batches per loss estimate
snapshot_interval = 0  # SBD stage: also keep ckpt_sbd_step<n>.pt every n steps (a learning curve)
halt_after = -1  # stop after this many iterations (time-boxed runs, tests); resume continues
report = True  # at the end: calibrate γ on val, Table 1 on test (evaluate.py)
report_problems = 0  # val/test problems the report uses (0 = all; the end-to-end test: a few)
report_args = ""  # a chat model's report: evaluate.py's settings, e.g. "--benchmark=... --ks=(16,)"
# system
seed = 1337
device = ""  # '' = autodetect cuda -> mps -> cpu
dtype = "float32"  # 'float32', 'bfloat16', 'float16' (CUDA), or 'auto': bf16 where native
compile = False  # torch.compile: worth it on a GPU, slow to start on a CPU
# fine-tuning a pretrained Llama 3 (config/sbd_llama8b.py)
seq_len = 2048  # tokens per row of a .jsonl dataset: prompt, response, padding
attention = "sdpa"  # 'sdpa': a dense (B, T, T) mask; 'flex' (CUDA): a flex_attention BlockMask
activation_checkpointing = False  # Llama: recompute each block's activations in backward
fsdp = False  # under torchrun: shard the model over the ranks (fp32 master weights)
# -----------------------------------------------------------------------------
config = configure(globals(), sys.argv[1:])
pretrained = init_from not in ("scratch", "resume")
if pretrained:
    pretrained_path(init_from)  # a clear error now, before anything else runs
check_training_settings(config)  # a setting out of its range: one line that says what is allowed
sbd_batch_size = sbd_batch_size or batch_size  # resolved once (the saved config keeps the input)

# under torchrun each process trains on its own batches, gradients averaged (training/parallel.py)
ddp = parallel.under_torchrun()
rank, world_size, device = parallel.start(pick_device(device))
master = rank == 0
device_type = "cuda" if device.startswith("cuda") else device
if attention == "flex" and device_type != "cuda":
    raise ConfigError("attention='flex' needs CUDA (flex_attention has no CPU backward): 'sdpa'")
dtype = resolve_dtype(dtype, device)
if dtype == "float16" and device_type != "cuda":
    raise ConfigError("dtype='float16' needs CUDA; on a CPU use 'bfloat16' or 'auto'")
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
# mixed precision: the weights stay fp32, matmuls run in ptdtype (on a CPU with AMX or AVX512-BF16,
# bf16 matmuls are 2-3x faster; elsewhere they are emulated and 'auto' keeps fp32)
use_autocast = dtype != "float32" and device_type in ("cuda", "cpu")
autocast = torch.autocast(device_type, ptdtype) if use_autocast else nullcontext()
if master:
    print(f"training in {'mixed ' + dtype if use_autocast else 'float32'} on {device}")
scaler = torch.amp.GradScaler(enabled=(dtype == "float16"))
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(seed + rank)

# the resumed checkpoint, read once: the model, the tokenizer and the optimizer all come from it
resume_path = os.path.join(out_dir, "ckpt_resume.pt")
checkpoint = None
if init_from == "resume":
    if not os.path.exists(resume_path):
        raise ConfigError(f"init_from=resume but there is no {resume_path}; start afresh")
    checkpoint = torch.load(resume_path, map_location="cpu", mmap=True, weights_only=True)
    config["init_from"] = checkpoint["config"]["init_from"]  # the weights' origin, read back later

# a pretrained model fine-tunes on chat pairs with its own tokenizer; a small GPT trains from
# scratch on a character task
llama = pretrained or checkpoint is not None and checkpoint["model_family"] == "llama"
if fsdp and not (ddp and llama):
    raise ConfigError("fsdp=True shards a Llama over the processes of torchrun")
if adapter_rank and ddp and not fsdp:
    raise ConfigError("a block adapter under torchrun trains with fsdp=True (DDP would expect a "
                      "gradient for every weight it was built with)")
llama_dtype = ptdtype if device_type == "cuda" and not fsdp else torch.float32
model = tokenizer = None
if pretrained:
    model, tokenizer = load_pretrained(init_from, device, llama_dtype)
elif llama:
    tokenizer = tokenizer_of(checkpoint["tokenizer"])

# data: fixed-length rows; `answer` marks each row's completion (what the model must write)
task = JsonlTask(dataset, tokenizer, seq_len) if llama else CharTask(dataset)
data = {split: task.training_tensors(split, loss_on_answer_only) for split in ("train", "val")}
L = task.seq_len


def get_batch(split, generator, rows):
    x, y, answer = data[split]
    ix = torch.randint(len(x), (rows,), generator=generator)
    x, y, answer = x[ix], y[ix], answer[ix]
    if llama:  # chat rows end in padding: drop the columns no row uses (no label, no attention)
        used = ((y != IGNORE_INDEX) | answer).any(0).nonzero()  # a label, or a token to mask
        n = int(used.max()) + 1 if len(used) else 1
        x, y, answer = x[:, :n], y[:, :n], answer[:, :n]
    return x.to(device), y.to(device), answer.to(device)


def forward_loss(model, stage, x, y, answer, k, generator, complementary, *, mask_id, ntp_weight,
                 loss_on_answer_only, block_phase, token_shift, make_mask, head_at_labels,
                 new_cache, all_masked_rows):
    """-> (loss to optimise, NTP loss, masked-token loss or None); keywords: loss_settings."""
    if stage == "ntp":
        at = y != IGNORE_INDEX if head_at_labels else None  # (B, L) or all slots
        _, loss = model(x, y if at is None else y[at], at=at)
        return loss, loss.detach(), None
    L = x.size(1)  # the clean half; the noisy copies, slots L on, are the forward's block
    maskable = answer if loss_on_answer_only else None
    phases = sbd.block_phases(answer, k, block_phase, generator).to(x.device)
    idx, pos, mask, labels = sbd.sbd_inputs(  # mask (B, T, T)
        x, y, mask_id, k, phases, maskable, generator, make_mask=make_mask,
        token_shift=token_shift, complementary=complementary, all_masked_rows=all_masked_rows)
    at = labels != IGNORE_INDEX if head_at_labels else None  # (B, T) or all slots
    if new_cache is not None:  # a block adapter: the clean half through the frozen base's cache
        return sbd.adapter_loss(model, new_cache(len(x), idx.size(1)), idx, pos, mask, labels, L,
                                at)
    logits, _ = model(idx, pos=pos, mask=mask, at=at, block_start=L)  # (B, T, V) or (N, V)
    return sbd.sbd_loss(logits, labels, L, ntp_weight)


# model: a small GPT from scratch, or a pretrained Llama (fp32 master weights under FSDP)
initial_state = None  # sbd_starts_from='init': stage 2 starts again from these weights
if pretrained:
    with_mask_row(model, init_from, task.mask_id)
    model_args = dataclasses.asdict(model.config)
elif llama:  # resuming: the architecture from the checkpoint, its weights below
    model_args = checkpoint["model_args"]
    with torch.device(device):
        model = Llama(LlamaConfig(**model_args)).to(llama_dtype)
else:
    model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=L,
                      vocab_size=task.vocab_size, dropout=dropout, bias=bias)
    model = GPT(GPTConfig(**model_args)).to(device)
if llama and model.config.vocab_size != task.vocab_size:
    raise ConfigError(f"the tokenizer has {task.vocab_size} tokens, the model "
                      f"{model.config.vocab_size}")
model.activation_checkpointing = activation_checkpointing  # a Llama switch (GPT has none)
if adapter_rank:  # attached now, before FSDP shards the model; it trains from the SBD stage on
    attach_adapter(model, adapter_rank, adapter_layers, task.mask_id)
in_stage_1 = checkpoint is None or checkpoint["stage"] == "ntp"  # halted at ntp_iters: still 1
if sbd_starts_from == "init" and ntp_iters > 0 and sbd_iters > 0 and in_stage_1:
    if fsdp:
        raise ConfigError("sbd_starts_from='init' is not supported with fsdp")
    if llama and checkpoint is not None:  # resumed in stage 1: init_from's weights again
        source, _ = load_pretrained(checkpoint["config"]["init_from"], "cpu", torch.float32)
        initial_state = with_mask_row(source, checkpoint["config"]["init_from"],
                                      task.mask_id).state_dict()
    else:  # the weights before any training (a scratch model's init is a function of the seed)
        initial_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {device}")
if adapter_rank:
    print(f"block adapter: rank {adapter_rank} on {adapter_layers} layers, "
          + budget.adapter_memory(model, fsdp, world_size))

iter_num, stage, estimated_at = 0, "ntp" if ntp_iters > 0 else "sbd", 0
if checkpoint is not None:
    check_resumable(checkpoint, resume_path, model_args, adapter_rank, adapter_layers, task)
    model.load_state_dict(checkpoint["model"])
    iter_num, stage = checkpoint["iter_num"], checkpoint["stage"]
    estimated_at = iter_num if checkpoint.get("estimated") else 0  # logged before it was saved
raw_model = model
model = parallel.wrap(model, compile, fsdp, ddp, ptdtype)  # compiled, sharded or replicated

# forward_loss's settings, read once here
loss_settings = dict(
    mask_id=task.mask_id, loss_on_answer_only=loss_on_answer_only, block_phase=block_phase,
    token_shift=token_shift, head_at_labels=head_at_labels, all_masked_rows=all_masked_rows,
    make_mask=flex_training_mask if attention == "flex" else sbd.training_mask,
    # with an adapter the clean half is the frozen NTP model: its term would teach nothing
    ntp_weight=0.0 if adapter_rank else ntp_weight,
    # an adapter's clean half goes once through a KV cache (sdpa), its keys in autocast's dtype
    new_cache=functools.partial(raw_model.new_cache, device=device,
                                dtype=ptdtype if use_autocast else None)
    if adapter_rank and attention == "sdpa" else None)


def new_optimizer(stage):
    """A fresh AdamW for a stage; with a block adapter, the SBD stage's trains the adapter alone."""
    if adapter_rank and stage == "sbd":
        sbd.freeze_base(raw_model)
    lr = ntp_lr if stage == "ntp" else sbd_lr
    return configure_optimizer(raw_model, weight_decay, lr, (beta1, beta2), device_type)


optimizer = new_optimizer(stage)
if checkpoint is not None:
    parallel.load_optimizer_state(raw_model, optimizer, checkpoint["optimizer"], fsdp)
checkpoint = None  # free memory


def lr_at(it):
    """Linear warmup then cosine decay to min_lr_ratio * peak, restarted at each stage's start."""
    peak, start, length = ((ntp_lr, 0, ntp_iters) if it < ntp_iters
                           else (sbd_lr, ntp_iters, sbd_iters))
    it -= start
    if it < warmup_iters:
        return peak * (it + 1) / (warmup_iters + 1)
    progress = min(1.0, (it - warmup_iters) / max(1, length - warmup_iters))
    return peak * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def log_estimate():
    """Mean NTP loss and masked-token loss (k = 8) per split, on the same batches every time:
    printed and appended to out_dir/eval.jsonl (log.jsonl has the steps). One noisy copy per
    row, the paper's noise, whatever complementary_masks and all_masked_rows say: runs with and
    without them estimate the same thing."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        generator = torch.Generator().manual_seed(seed)
        ntp, masked = [], []
        for _ in range(eval_iters):
            batch = get_batch(split, generator, batch_size)
            with autocast:
                _, ntp_loss, masked_loss = forward_loss(raw_model, "sbd", *batch, min(8, k_max),
                                                        generator, False,
                                                        **{**loss_settings, "all_masked_rows": 0})
            ntp.append(ntp_loss.item())
            masked.append(masked_loss.item())
        out[split] = (sum(ntp) / len(ntp), sum(masked) / len(masked))
    if fsdp:  # without a backward, FSDP leaves the root's parameters gathered: shard them again
        raw_model.reshard()
    model.train()
    if master:
        print(f"iter {iter_num}: NTP loss train {out['train'][0]:.4f} val {out['val'][0]:.4f} | "
              f"masked-token loss (k=8) train {out['train'][1]:.4f} val {out['val'][1]:.4f}")
        with open(os.path.join(out_dir, "eval.jsonl"), "a") as f:
            f.write(json.dumps(dict(iter=iter_num, stage=stage, **out)) + "\n")


def stage_checkpoint(whole=False):
    """The stage's checkpoint (checkpoint.training_checkpoint). Under FSDP every rank must call
    this (it gathers the shards); only rank 0's holds the weights."""
    adapter = dict(rank=adapter_rank, layers=adapter_layers, mask_id=task.mask_id)
    return training_checkpoint(parallel.model_state(raw_model, fsdp), "llama" if llama else "gpt",
                               model_args, stage, config, task, iter_num,
                               adapter if adapter_rank else None, whole)


def save(name, checkpoint):
    """out_dir/ckpt_<name>.pt, written by rank 0, atomically."""
    if master:
        save_checkpoint(checkpoint, os.path.join(out_dir, f"ckpt_{name}.pt"))


def save_resume(estimated=False):
    """Under FSDP every rank must call this; the optimizer state is saved whole, keyed by name.
    estimated: this iteration's log_estimate is in eval.jsonl (a resume does not repeat it)."""
    save("resume", dict(stage_checkpoint(whole=True), estimated=estimated,
                        optimizer=parallel.optimizer_state(raw_model, optimizer, fsdp)))


# training loop
total_iters = ntp_iters + sbd_iters
log_path = os.path.join(out_dir, "log.jsonl")
t0 = started = time.time()
step_seconds = {}  # each stage's measured seconds per step (the estimate of the time left)
sbd_work = budget.sbd_step_work(adapter_rank, 1 + complementary_masks, sbd_batch_size, batch_size)


while iter_num < total_iters:
    if stage == "ntp" and iter_num >= ntp_iters:  # stage 1 done: its weights are the baseline
        save("ntp", stage_checkpoint())
        if master:
            print(f"saved the NTP baseline to {out_dir}/ckpt_ntp.pt; starting SBD fine-tuning")
        if initial_state is not None:  # the paper's Table 1 pair: both stages from one model
            raw_model.load_state_dict(initial_state)
            initial_state = None
        stage, optimizer = "sbd", new_optimizer("sbd")

    if iter_num % eval_interval == 0 and iter_num != estimated_at and (master or fsdp):
        log_estimate()  # FSDP: every rank
        save_resume(estimated=True)
        estimated_at = iter_num
    if iter_num == halt_after:
        break
    if stage == "sbd" and snapshot_interval and (iter_num - ntp_iters) % snapshot_interval == 0:
        save(f"sbd_step{iter_num - ntp_iters}", stage_checkpoint())  # the weights before this step

    lr = lr_at(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    # every random draw of a step (batch, k, noise, dropout) is a function of (seed, rank,
    # iter_num) alone, so a resumed run, on any number of ranks, draws what an uninterrupted would
    rng = step_generator(seed, rank, iter_num)
    torch.manual_seed(hash((seed, rank, iter_num, 1)) % 2**63)
    rows = batch_size if stage == "ntp" else sbd_batch_size
    k = k_min + int(torch.randint(0, k_max - k_min + 1, (1,), generator=rng))  # one k per step
    for micro_step in range(gradient_accumulation_steps):
        if ddp and not fsdp:  # synchronise gradients on the last micro-step only
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with autocast:
            loss, ntp_loss, masked_loss = forward_loss(model, stage, *get_batch("train", rng, rows),
                                                       k, rng, complementary_masks, **loss_settings)
        scaler.scale(loss / gradient_accumulation_steps).backward()
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    if iter_num % log_interval == 0 and master:
        dt = (time.time() - t0) / (log_interval if iter_num > 0 else 1)
        t0 = time.time()
        first_pace = iter_num > 0 and not step_seconds
        if iter_num > 0:  # iteration 0's time is mostly warm-up
            step_seconds[stage] = dt
        progress = ""
        if step_seconds:  # the pace measured so far
            left = budget.seconds_left(iter_num, ntp_iters, sbd_iters, step_seconds, sbd_work)
            progress = f", {budget.clock(t0 - started)} elapsed, ~{budget.clock(left)} left"
        copies = 1 if stage == "ntp" else 2 + complementary_masks  # clean half + noisy copies
        tokens = rows * gradient_accumulation_steps * world_size * L * copies
        masked_text = f", masked-token {masked_loss.item():.4f} (k={k})" if stage == "sbd" else ""
        # the configs' memory estimates are checked against this peak
        memory = (f", peak {torch.cuda.max_memory_allocated() / 1e9:.1f} GB"
                  if device_type == "cuda" else "")
        print(f"iter {iter_num} [{stage}]: loss {loss.item():.4f} (NTP {ntp_loss.item():.4f}"
              f"{masked_text}), lr {lr:.2e}, {dt * 1000:.0f} ms/iter, {tokens / dt:,.0f} tokens/s"
              f"{memory}{progress}")
        if first_pace:
            total = budget.clock(t0 - started + left)
            print(f"at this pace training takes about {total} on this machine"
                  f"{', then the report' if report else ''}")
        with open(log_path, "a") as f:
            f.write(json.dumps(dict(iter=iter_num, stage=stage, loss=loss.item(), k=k, rows=rows))
                    + "\n")
    iter_num += 1

if master or fsdp:  # under FSDP every rank helps gather the checkpoints, rank 0 writes them
    save_resume(estimated=estimated_at == iter_num)
    if iter_num < total_iters:
        if master:
            print(f"halted after iteration {iter_num}; continue with --init_from=resume")
    else:
        if iter_num % eval_interval == 0:  # the last step's estimate, as every eval_interval's
            log_estimate()
        checkpoint = stage_checkpoint()
        if stage == "sbd" and adapter_only and master:  # its base: the tensors ckpt_ntp.pt holds
            checkpoint = adapter_alone(checkpoint, os.path.join(out_dir, "ckpt_ntp.pt"))
        save(stage, checkpoint)
        if master:
            print(f"saved the {stage.upper()} model to {out_dir}/ckpt_{stage}.pt")
        if stage == "sbd" and report and master:  # Table 1 (evaluate.py)
            import evaluate

            evaluate.main([f"--out_dir={out_dir}", f"--device={device}",
                           f"--max_problems={report_problems}", *report_args.split()])
parallel.finish()  # under torchrun: once rank 0 has written everything
