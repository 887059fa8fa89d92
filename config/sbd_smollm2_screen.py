# A lever screen on SmolLM2: laid over config/sbd_smollm2.py and config/sbd_smollm2_full.py, one
# SBD fine-tune of the pretrained model for 200 steps (no NTP stage, no report), read out by
# report/screen.py in minutes. Arms differ by one setting and share the seed, so their batches,
# block sizes and masks are the same (an adapter arm starts from an NTP checkpoint instead:
# --init_from=<ckpt_ntp.pt> --adapter_rank=64 --sbd_lr=2e-3):
#
#   FULL="config/sbd_smollm2.py config/sbd_smollm2_full.py config/sbd_smollm2_screen.py"
#   python train.py $FULL --out_dir=out-screen-shift
#   python train.py $FULL --out_dir=out-screen-paper --token_shift=False
#   python -m report.screen --a=out-screen-paper --b=out-screen-shift   # paired read-out
#
# On a 2-core AMD EPYC with AVX-512 BF16 (no AMX) a step took 3.6-4.2 s (5.1-5.5 s with
# complementary_masks): 12-18 minutes of steps; the read-out takes about 2 minutes a checkpoint.
out_dir = "out-sbd-smollm2-screen"
ntp_iters = 0
sbd_iters = 200
eval_interval = 100
eval_iters = 4
report = False
