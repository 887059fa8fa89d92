"""
Decoding for serving: what a batch, a compiled graph or a long run adds to the method, kept apart
from the reference decoders a student reads (decode.py at the root), whose rules it calls.

- batched.py: NTP and plain SBD for batches through the static KV cache, eager or compiled
  (torch.compile, one graph per width), and the step view.
- exact.py: exact SBD for batches (per-row cache lengths, lockstep forwards), the adaptive block
  size, the draft floor, the step view's checks; decode(), the entry that evaluate.py and the
  benchmarks call, and decoders(), which picks sample.py's (decode.py's unless a setting needs
  serving).
- settings.py: ServingSettings, sampling.DecodeSettings with serving's own fields (adaptive,
  min_draft_prob, compiled).
- layout.py: the weights laid out once for decoding (fused, in the decode dtype, int8 or a GGUF
  file's 4-bit blocks), and what decodes fastest on this machine (fastest_setup).
"""
