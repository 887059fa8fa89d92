# The SmolLM2 run for those with more time: laid over config/sbd_smollm2.py, both fine-tunes of the
# pretrained model get 4x the default's steps (1800 each, as the learning curve's SBD stage), then
# Table 1 on 1000 test problems, where a paired difference of one point is about one standard
# error.
#
#   python train.py config/sbd_smollm2.py config/sbd_smollm2_long.py
#
# Time on a 2-core CPU with bf16: README. Stop it any time and continue with the same command plus
# --init_from=resume.
out_dir = "out-sbd-smollm2-long"
ntp_iters = 1800
sbd_iters = 1800
eval_interval = 300
eval_iters = 8
report_problems = 1000
