# SmolLM2 with a block adapter (docs/method.md, Block adapter), laid over config/sbd_smollm2.py:
#
#   python train.py config/sbd_smollm2.py config/sbd_smollm2_adapter.py
#
# Stage 1 is the NTP fine-tune (the baseline); stage 2 freezes it and trains a rank-64 delta on
# every linear layer plus a mask embedding, which only the block's slots see. The SBD model's
# next-token path is then the NTP fine-tune itself: its NTP decoding and its exact SBD decode the
# baseline's tokens. The screen behind these values: docs/findings.md, "A block adapter".
out_dir = "out-sbd-smollm2-adapter"
sbd_starts_from = "ntp"  # the adapter trains on top of the NTP fine-tune
adapter_rank = 64
adapter_layers = "all"
adapter_only = True  # ckpt_sbd.pt: the adapter alone (its base is ckpt_ntp.pt)
sbd_lr = 2e-3  # a low-rank delta from zero learns at a higher lr than the full weights
