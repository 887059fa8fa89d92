# The SmolLM2 run for those with more time: laid over config/sbd_smollm2.py, both stages get 1800
# steps (4x the NTP fine-tune's, as the learning curve's SBD stage), then Table 1 on 1000 test
# problems, where a paired difference of one point is about one standard error.
#
#   python train.py config/sbd_smollm2.py config/sbd_smollm2_long.py          # the block adapter
#   python train.py config/sbd_smollm2.py config/sbd_smollm2_full.py \
#       config/sbd_smollm2_long.py
#
# On a 2-core AMD EPYC (Zen 5, AVX-512 BF16, no AMX) the NTP steps took 65 minutes (2.16 s each)
# and full SBD steps take 2.5 s (bench/train_step.py), about 75 minutes, with the paper's alignment
# (an adapter step costs 0.67x); neither token shift nor the adapter has been run this long. The
# report decodes 1000 test problems at k = 16 (500 took 17 minutes there). Stop it any time and
# continue with the same command plus --init_from=resume.
out_dir = "out-sbd-smollm2-long"
ntp_iters = 1800
sbd_iters = 1800
eval_interval = 300
eval_iters = 8
report_problems = 1000
