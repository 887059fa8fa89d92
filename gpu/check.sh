#!/bin/bash
# The GPU check of this repository, as run on one H200 (README, "Llama checkpoints on GPUs"): no
# checkpoint is needed (random weights with real shapes), transformers 5.x is (for the reference in step 3).
#   bash gpu/check.sh            logs in $OUT (default /tmp/gpu-check); about 10 minutes on an H200
#   python3 gpu/check_fast_decode.py   the fast decode alone: 2-3 minutes, no checkpoint
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu-check}; mkdir -p $OUT
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
echo "== 1. the CUDA tests: compiled flex_attention vs SDPA, the 8B config's GPU settings"
python3 -m pytest tests/test_llama_sbd.py -rs -q -k "cuda or gpu" 2>&1 | tail -3
echo "== 2. bench/gpu.py: Llama-3.1-8B shapes, decode tokens/s vs bandwidth, t(k)/t(1) vs the roofline; and the"
echo "      product's compiled step (static cache, CUDA graphs) at widths 1, 16, 32"
python3 -m bench.gpu --static=True --ks="(1,16,32)" 2>&1 | tee $OUT/bench_gpu.log
echo "== 2b. the compiled decode (CUDA graphs) == eager, every decoder; Llama-3.2-1B shapes eager vs compiled"
python3 gpu/check_fast_decode.py 2>&1 | tee $OUT/fast_decode.log
echo "== 3. load_llama vs transformers' LlamaForCausalLM at Llama-3.2-1B shapes (5.x config, tied embeddings)"
python3 gpu/check_against_transformers.py $OUT/llama1b 2>&1 | grep -v -i "warn\|shards\|Loading weights" | tee $OUT/check_hf.log
echo "== 4. train.py config/sbd_llama1b.py, 20 iterations of its own settings (FSDP2 one rank, bf16, flex, checkpointing)"
torchrun --standalone --nproc_per_node=1 train.py config/sbd_llama1b.py --init_from=$OUT/llama1b \
    --dataset=$OUT/llama1b/pairs.jsonl --out_dir=$OUT/out1b --sbd_iters=20 --gradient_accumulation_steps=1 \
    --warmup_iters=5 --log_interval=5 --eval_interval=1000 2>&1 | tee $OUT/train1b.log | grep "iter \|saved\|Error"
echo "== 5. evaluate.py --benchmark (Table 1 layout; a random model scores 0) and sample.py --exact"
python3 evaluate.py --out_dir=$OUT/out1b --benchmark=$OUT/llama1b/bench.jsonl --max_problems=4 --max_new_tokens=32 \
    --exact_val_problems=2 --timing_problems=2 2>&1 | tee $OUT/eval1b.log | grep -v "^forward" | tail -20
python3 sample.py --out_dir=$OUT/out1b --start="What is 3 + 5?" --num_samples=1 --max_new_tokens=32 --exact=True 2>&1 | tail -2
