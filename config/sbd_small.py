# The first command to run: python train.py config/sbd_small.py
# A 0.2M-parameter GPT learns column addition written out as a reasoning trace (data/addition):
# first with next-token prediction (the baseline), then SBD fine-tuning of the same weights; at the
# end evaluate.py calibrates γ on val and prints the paper's Table 1 on held-out test problems.
# About 11 minutes on 2 CPU cores (README). train.py's defaults are this recipe; the values are
# stated here so that the recipe reads in one place. Why each: docs/findings.md.
out_dir = "out-sbd-small"
dataset = "addition"

n_layer = 4  # small enough to train in minutes on a laptop CPU
n_head = 4
n_embd = 64  # a quarter of width 128's matrix FLOPs, and Table 1 holds (findings: budget)

# stage 1: NTP pretraining
batch_size = 64
ntp_iters = 1000
ntp_lr = 2e-3

# stage 2: SBD fine-tuning; the masked-token path needs more steps than stage 1 (SBD steps)
sbd_iters = 4500
sbd_batch_size = 32  # at equal compute, more steps beat more rows
sbd_lr = 2e-3
k_min = 8  # k ~ U{8..16}, not the paper's U{2..16}: every offset of the decoded k = 16 block
k_max = 16  # is trained often enough (Block sizes)
min_lr_ratio = 0.01  # both stages decay to 1% of their peak: a quiet end, fewer confident mistakes
loss_on_answer_only = True  # the prompt's operands are random: predicting them is noise
block_phase = "answer"  # noisy blocks start where decoding blocks start: after the prompt

log_interval = 100
eval_interval = 500
