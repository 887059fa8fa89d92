# The full SBD fine-tune's learning curve on SmolLM2: laid over config/sbd_smollm2.py and
# config/sbd_smollm2_full.py, one SBD fine-tune of the pretrained model (no NTP stage, no report)
# for 4x the full fine-tune's steps, keeping its weights every 150 steps for report.curve to decode.
# (The adapter's curve starts from an NTP checkpoint: docs/findings.md, "The block adapter at equal
# minutes".)
#
#   python train.py config/sbd_smollm2.py config/sbd_smollm2_full.py config/sbd_smollm2_curve.py
#   python -m report.curve --out_dir=out-sbd-smollm2-curve --problems=32
#
# About 75 minutes of steps on a 2-core CPU with bf16 (2.5 s per step on an AMD EPYC, Zen 5,
# AVX-512 BF16: bench/train_step.py), plus a 0.5 GB snapshot every 150 steps. Stop it any time
# and continue with the same command plus --init_from=resume.
out_dir = "out-sbd-smollm2-curve"
ntp_iters = 0
sbd_iters = 1800
eval_interval = 150  # the estimated masked-token val loss of each snapshot (eval.jsonl)
eval_iters = 8
snapshot_interval = 150
report = False
