# The paper's SBD fine-tune on SmolLM2, laid over config/sbd_smollm2.py: every weight trained, no
# adapter. As the paper's Table 1 does, it fine-tunes the pretrained model twice on the same data
# for the same steps: with NTP (the baseline, ckpt_ntp.pt) and with SBD, NTP term kept
# (ckpt_sbd.pt).
#
#   python train.py config/sbd_smollm2.py config/sbd_smollm2_full.py
#
# The two heads share every weight and compete at this length: the SBD model's own NTP decoding
# lost 5 points to the baseline over two seeds (docs/findings.md, "Two seeds of the default
# recipe"), which the block adapter of config/sbd_smollm2.py avoids by construction.
out_dir = "out-sbd-smollm2-full"
sbd_starts_from = "init"  # two fine-tunes of the pretrained model, same data, same steps
sbd_iters = 450
adapter_rank = 0
adapter_only = False
all_masked_rows = 0.0  # the paper's noise: its plain SBD reveals into partly masked blocks
sbd_lr = 3e-4  # (0.80 against 1.11 masked-token val loss for 1e-4 after 400 and 300 SBD steps)
