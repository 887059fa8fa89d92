"""
Benchmarks and the roofline: python -m bench --what=... times decoding on a CPU or GPU,
python -m bench.roofline prints Eq. 16's predictions, python -m bench.gpu measures a GPU.
Benchmarks print ratios measured side by side; no test times anything.
"""
