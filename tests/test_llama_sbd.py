"""The Llama SBD fine-tuning path on a CPU, with a tiny random Llama written by the test in Meta's
and HF's layouts, a tiny tokenizer.model (the 256 single bytes, so the special tokens are ids
256..511) and a tiny JSONL file: JSONL rows, flex_attention == dense SDPA, activation checkpointing,
train.py SBD steps through the 8B config (and a resume), FSDP == DDP on two CPU processes,
sample.py, the mask token never sampled, bench/gpu.py's CPU preset. Two tests need CUDA (compiled
flex_attention with its backward; the config's GPU settings) and skip here; on a GPU machine run
this file, then `python -m bench.gpu` (its header says what it measures)."""

import base64
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask

import sampling
import sbd
import tiny_models
from checkpoint import load_checkpoint
from model import (
    IGNORE_INDEX,
    Llama,
    LlamaConfig,
    rope_frequencies,
)
from pretrained.load_llama import config_from_hf, init_mask_embedding, write_safetensors
from pretrained.loading import load_pretrained
from pretrained.shapes import LLAMA_PRESETS
from sbd import is_adapter
from serving import batched
from tasks import JsonlTask
from test_llama_io import tiny_config_json, to_hf
from training.flex import flex_training_mask

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_BASE = 256  # byte ranks only: <|begin_of_text|> = 256, mask (reserved_0) = 258, <|eot_id|> = 265
MASK, EOT, PAD = N_BASE + 2, N_BASE + 9, N_BASE + 4
TINY = dict(LLAMA_PRESETS["llama-tiny"], vocab_size=2 * N_BASE, rope_original_context=8192)
PAIRS = [{"prompt": f"What is {a} + {b}?", "response": f"{a} + {b} = {a + b}."} for a, b in
         [(1, 2), (3, 4), (10, 20), (7, 8), (5, 5), (12, 30), (2, 9), (40, 2)]]


def write_tokenizer(path):
    path.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    return path


def tiny_llama():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**TINY))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms away from 1: nothing trivially symmetric
    return model


def write_llama_dir(directory, layout):
    """A tiny Llama checkpoint directory in Meta's layout or an HF repo (tokenizer in original/)."""
    model = tiny_llama()
    directory.mkdir(parents=True)
    if layout == "meta":
        keys = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
                "ffn_dim_multiplier", "norm_eps", "rope_theta", "use_scaled_rope")  # params.json
        params = {k: getattr(model.config, k) for k in keys}
        (directory / "params.json").write_text(json.dumps(params))
        torch.save(model.state_dict(), directory / "consolidated.00.pth")
        write_tokenizer(directory / "tokenizer.model")
    else:
        config = {**tiny_config_json(8192), "vocab_size": 2 * N_BASE}
        (directory / "config.json").write_text(json.dumps(config))
        write_safetensors(to_hf(model), directory / "model.safetensors")
        (directory / "original").mkdir()
        write_tokenizer(directory / "original" / "tokenizer.model")
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return dict(tokenizer=str(write_tokenizer(d / "tokenizer.model")), jsonl=str(d / "pairs.jsonl"),
                dir=d)


# -----------------------------------------------------------------------------
# config and data


def test_ffn_hidden_size_overrides_the_recipe():
    assert LlamaConfig(**TINY).ffn_hidden == 224  # int(1.3 * int(8 * 64 / 3)) = 221 -> 7 x 32
    assert LlamaConfig(**TINY, ffn_hidden_size=200).ffn_hidden == 200
    config = config_from_hf({**tiny_config_json(8192), "intermediate_size": 200}, "config.json")
    assert config.ffn_hidden == 200
    assert Llama(config).layers[0].feed_forward.w1.weight.shape == (200, 64)


def test_jsonl_rows(files):
    task = JsonlTask(files["jsonl"], files["tokenizer"], seq_len=64)
    assert (task.mask_id, task.stop_id, task.vocab_size) == (MASK, EOT, 512)
    assert task.stop_ids == [257, 264, 265]
    assert len(task.splits["val"]) == 1 and len(task.splits["train"]) == 7  # 1%, at least one pair
    pairs = sorted((p["prompt"], p["response"]) for p in PAIRS)
    assert sorted(task.splits["train"] + task.splits["val"]) == pairs
    again = JsonlTask(files["jsonl"], files["tokenizer"], seq_len=64)
    assert again.splits == task.splits  # a fixed split
    x, y, answer = task.training_tensors("train", loss_on_answer_only=True)
    assert x.shape == y.shape == answer.shape == (7, 64)
    prompt, response = task.splits["train"][0]
    p = task.encode_prompt(prompt)  # one id per byte; 262/263 = start/end of a header
    assert p == [256, 262, *b"user", 263, *b"\n\n", *prompt.encode(), EOT,
                 262, *b"assistant", 263, *b"\n\n"]
    r = list(response.encode()) + [EOT]
    assert x[0].tolist() == p + r + [PAD] * (64 - len(p) - len(r))
    assert answer[0].tolist() == ([False] * len(p) + [True] * len(r)
                                  + [False] * (64 - len(p) - len(r)))
    # targets: only the response and its <|eot_id|> (predicted from the position before each)
    assert y[0].tolist() == ([IGNORE_INDEX] * (len(p) - 1) + r
                             + [IGNORE_INDEX] * (65 - len(p) - len(r)))
    _, y_all, _ = task.training_tensors("train", loss_on_answer_only=False)
    # the prompt too, never padding
    assert y_all[0].tolist() == p[1:] + r + [IGNORE_INDEX] * (65 - len(p) - len(r))


def test_jsonl_cuts_long_rows_and_reports_bad_files(files, tmp_path, capsys):
    # rows of 39; chat prompts are 37-39 tokens
    task = JsonlTask(files["jsonl"], files["tokenizer"], seq_len=38)
    x, y, answer = task.training_tensors("train", loss_on_answer_only=True)
    assert 0 < len(x) < 7 and answer.any(dim=1).all() and (y != IGNORE_INDEX).any(dim=1).all()
    out = capsys.readouterr().out
    assert f"7 of 7 pairs cut at seq_len=38 ({7 - len(x)} of them dropped" in out
    with pytest.raises(ValueError, match='"prompt".*"response"'):
        JsonlTask(str(tmp_path / "nowhere.jsonl"), files["tokenizer"], seq_len=30)
    (tmp_path / "bad.jsonl").write_text(json.dumps(PAIRS[0]) + "\n"
                                        + json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        JsonlTask(str(tmp_path / "bad.jsonl"), files["tokenizer"], seq_len=30)


# -----------------------------------------------------------------------------
# model: flex_attention and activation checkpointing


def sbd_batch(L=20, k=4):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2 * N_BASE, (2, L), generator=g)
    answer = torch.arange(L) >= torch.tensor([[5], [7]])  # answers start at 5 and 7: per-row phases
    return x, x.roll(-1, 1), answer, k, (answer.int().argmax(1) % k), g


def test_flex_attention_matches_dense_sdpa():
    """The same pure mask function as a BlockMask (flex_attention, eager on a CPU) and as a dense
    bool mask (SDPA)."""
    model = tiny_llama().eval()
    x, y, answer, k, phases, g = sbd_batch()
    idx, pos, dense, _ = sbd.sbd_inputs(x, y, MASK, k, phases, answer,
                                        torch.Generator().manual_seed(1))
    _, _, flex, _ = sbd.sbd_inputs(x, y, MASK, k, phases, answer,
                                   torch.Generator().manual_seed(1), make_mask=flex_training_mask)
    T = idx.size(1)  # 2L = 40 less the noisy prompt copies nothing reads (sbd.first_noisy_position)
    assert isinstance(flex.block_mask, BlockMask) and dense.shape == (2, T, T) and T < 40
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()": CPU
        want, _ = model(idx, pos=pos, mask=dense)
        got, _ = model(idx, pos=pos, mask=flex)
    assert (got - want).abs().max() < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="compiled flex_attention and its backward need CUDA")
def test_compiled_flex_attention_matches_dense_sdpa_on_cuda():
    """What train.py runs on a GPU: compiled flex_attention, forward and backward, equal to dense
    SDPA; and no recompilation when the block size changes from step to step (k is a tensor in the
    mask function)."""
    model = tiny_llama().cuda()
    torch._dynamo.reset()
    for i, k in enumerate((2, 5, 16)):
        x, y, answer, _, phases, _ = (t.cuda() if torch.is_tensor(t) else t
                                      for t in sbd_batch(L=160, k=k))
        results = []
        for flex in (False, True):
            noise = torch.Generator("cuda").manual_seed(1)
            make_mask = flex_training_mask if flex else sbd.training_mask
            idx, pos, mask, labels = sbd.sbd_inputs(x, y, MASK, k, phases, answer, noise,
                                                    make_mask=make_mask)
            model.zero_grad()
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                logits, _ = model(idx, pos=pos, mask=mask)
                sbd.sbd_loss(logits, labels, x.size(1))[0].backward()
            results.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
        (want, want_grads), (got, got_grads) = results
        assert (got - want).abs().max() < 1e-4
        assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-5)
                   for a, b in zip(got_grads, want_grads))


def test_casting_to_bf16_keeps_the_rotary_frequencies_in_fp32():
    model = tiny_llama().to(torch.bfloat16)
    assert model.output.weight.dtype == torch.bfloat16 and model.inv_freq.dtype == torch.float32
    assert torch.equal(model.inv_freq, rope_frequencies(model.config))


def test_activation_checkpointing_gives_the_same_gradients():
    model = tiny_llama()
    x, y, answer, k, phases, g = sbd_batch()
    idx, pos, mask, labels = sbd.sbd_inputs(x, y, MASK, k, phases, answer, g)
    grads = []
    for checkpointing in (False, True):
        model.activation_checkpointing = checkpointing
        model.zero_grad()
        logits, _ = model(idx, pos=pos, mask=mask)
        sbd.sbd_loss(logits, labels, x.size(1))[0].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


# -----------------------------------------------------------------------------
# train.py on a tiny Llama, then decoding its checkpoint


def run(script, *args, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["meta", "hf"])
def test_train_py_fine_tunes_a_tiny_llama(files, tmp_path, layout):
    write_llama_dir(tmp_path / layout, layout)
    out_dir = tmp_path / "out"
    args = ["config/sbd_llama8b.py", f"--init_from={tmp_path / layout}",
            f"--dataset={files['jsonl']}", f"--out_dir={out_dir}", "--device=cpu",
            "--dtype=float32", "--fsdp=False", "--attention=sdpa", "--seq_len=48", "--batch_size=2",
            "--gradient_accumulation_steps=2", "--sbd_iters=2", "--warmup_iters=1",
            "--eval_interval=1", "--eval_iters=1", "--log_interval=1"]  # the GPU config, shrunk
    log = run("train.py", *args)
    assert "iter 1 [sbd]" in log and "saved the SBD model" in log
    model, ckpt = load_checkpoint(str(out_dir / "ckpt_sbd.pt"))
    assert ckpt["model_family"] == "llama" and LlamaConfig(**ckpt["model_args"]) == model.config
    assert model.config.vocab_size == 512 and model.config.n_kv_heads == 2
    tokenizer_path = str(tmp_path / layout / ("tokenizer.model" if layout == "meta"
                                              else "original/tokenizer.model"))
    assert ckpt["tokenizer"] == dict(kind="llama", path=tokenizer_path)
    assert ckpt["stage"] == "sbd" and ckpt["mask_id"] == MASK
    assert ckpt["stop_ids"] == [257, 264, 265]
    if layout == "meta":  # resume continues where the run stopped
        log = run("train.py", *args, "--init_from=resume", "--sbd_iters=3")
        assert "iter 2 [sbd]" in log and "iter 1 [sbd]" not in log
        resumed = torch.load(out_dir / "ckpt_sbd.pt", weights_only=False)
        assert resumed["iter_num"] == 3
        # the resumed run records where the weights came from (int4 and stage 1 read it)
        assert resumed["config"]["init_from"] == ckpt["config"]["init_from"] != "resume"
        # sample.py: the fine-tuned checkpoint (SBD and NTP), and the Llama as downloaded (NTP only)
        log = run("sample.py", f"--out_dir={out_dir}", "--start=What is 2 + 2?", "--num_samples=1",
                  "--max_new_tokens=8", "--device=cpu", "--gamma=0.35")  # no calibration.json yet
        assert "What is 2 + 2?" in log and "SBD k=16" in log and "vs NTP" in log
        log = run("sample.py", f"--init_from={tmp_path / layout}", "--mode=ntp", "--start=Hi",
                  "--num_samples=1", "--max_new_tokens=8", "--device=cpu")
        assert "NTP: 8 tokens in 8 forwards" in log
    # the mask token is an input only: even where it is the model's favourite, no decoder emits it
    model.output.register_forward_hook(lambda module, inputs, logits: logits.index_add(
        -1, torch.tensor([MASK]), torch.full((*logits.shape[:-1], 1), 100.0)))
    prompt = JsonlTask(files["jsonl"], tokenizer_path, 48).encode_prompt("What is 2 + 2?")
    logits, _ = model(torch.tensor([prompt]))
    assert (logits.argmax(-1) == MASK).all()  # the unsuppressed favourite everywhere
    settings = sampling.DecodeSettings(mask_id=MASK, k=4, gamma=0.5, stop_ids=[EOT])
    out, _ = batched.sbd_generate(model, [prompt], settings, 12)
    assert len(out[0]) > 0 and MASK not in out[0]
    settings = sampling.DecodeSettings(mask_id=MASK, k=4, gamma=0.5, temperature=1.0)
    out, _ = batched.sbd_generate(model, [prompt], settings, 12,
                                   generator=torch.Generator().manual_seed(0))
    assert MASK not in out[0]
    out, _ = tiny_models.ntp(model, [prompt], 12, mask_id=MASK)
    assert MASK not in out[0]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the GPU settings of config/sbd_llama8b.py need CUDA")
def test_train_py_gpu_settings(files, tmp_path):
    """One GPU, the config's own settings (bf16 weights, flex_attention, activation checkpointing),
    tiny sizes."""
    write_llama_dir(tmp_path / "hf", "hf")
    log = run("train.py", "config/sbd_llama8b.py", f"--init_from={tmp_path / 'hf'}",
              f"--dataset={files['jsonl']}", f"--out_dir={tmp_path / 'out'}", "--fsdp=False",
              "--seq_len=160", "--batch_size=2", "--gradient_accumulation_steps=2", "--sbd_iters=3",
              "--warmup_iters=1", "--eval_interval=2", "--eval_iters=1", "--log_interval=1")
    assert "iter 2 [sbd]" in log and "device cuda" in log
    model, ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt_sbd.pt"), "cuda")
    assert model.output.weight.dtype == torch.bfloat16 and ckpt["config"]["attention"] == "flex"


@pytest.mark.slow
def test_fsdp_and_ddp_agree_on_two_cpu_processes(files, tmp_path):
    """torchrun, 2 CPU processes (gloo): FSDP2 (shards, checkpoints gathered on rank 0) trains
    exactly as DDP."""
    write_llama_dir(tmp_path / "meta", "meta")
    losses, weights = {}, {}
    for mode in ("ddp", "fsdp"):
        out_dir = tmp_path / mode
        args = ["config/sbd_llama8b.py", f"--init_from={tmp_path / 'meta'}",
                f"--dataset={files['jsonl']}", f"--out_dir={out_dir}", "--dtype=float32",
                f"--fsdp={mode == 'fsdp'}", "--attention=sdpa", "--seq_len=48", "--batch_size=2",
                "--gradient_accumulation_steps=1", "--sbd_iters=3", "--warmup_iters=1",
                "--eval_interval=2", "--eval_iters=1", "--log_interval=1"]
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node=2", "train.py", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=240,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        lines = (out_dir / "log.jsonl").read_text().splitlines()
        losses[mode] = [json.loads(line)["loss"] for line in lines]
        weights[mode] = load_checkpoint(str(out_dir / "ckpt_sbd.pt"))[0].state_dict()
    assert len(losses["fsdp"]) == 3 and losses["fsdp"] == pytest.approx(losses["ddp"], abs=1e-4)
    assert all(torch.allclose(weights["fsdp"][name], w, atol=1e-5)
               for name, w in weights["ddp"].items())


@pytest.mark.slow
def test_fsdp_trains_a_block_adapter_on_two_cpu_processes(files, tmp_path):
    """torchrun, 2 CPU processes (gloo), the 8B config's adapter path shrunk: FSDP2 trains the
    block adapter alone. The SBD checkpoint's base weights are the model as loaded (its mask row
    initialised as train.py does), bit for bit, and the adapter moved."""
    write_llama_dir(tmp_path / "meta", "meta")
    out_dir = tmp_path / "out"
    args = ["config/sbd_llama8b.py", f"--init_from={tmp_path / 'meta'}",
            f"--dataset={files['jsonl']}", f"--out_dir={out_dir}", "--dtype=float32",
            "--fsdp=True", "--attention=sdpa", "--seq_len=48", "--batch_size=2",
            "--gradient_accumulation_steps=1", "--sbd_iters=3", "--warmup_iters=1",
            "--eval_interval=2", "--eval_iters=1", "--log_interval=1", "--adapter_rank=4",
            "--sbd_lr=1e-2"]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", "train.py", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "block adapter: rank 4" in out.stdout and "GB per process" in out.stdout
    trained = torch.load(out_dir / "ckpt_sbd.pt", weights_only=False)
    assert trained["adapter"]["rank"] == 4
    base, _ = load_pretrained(str(tmp_path / "meta"), "cpu", torch.float32)
    expected = init_mask_embedding(base, MASK).state_dict()
    for name, tensor in trained["model"].items():
        if is_adapter(name):
            assert not name.endswith(".B") or tensor.abs().sum() > 0, name  # B starts at 0
        else:
            assert torch.equal(tensor, expected[name]), name


def test_train_py_rejects_mismatched_settings(files):
    out = subprocess.run([sys.executable, "train.py", f"--dataset={files['jsonl']}",
                          "--device=cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "a .jsonl dataset fine-tunes a Llama" in out.stderr


# -----------------------------------------------------------------------------
# bench/gpu.py: the CPU smoke test of the GPU benchmark


@pytest.mark.slow
def test_bench_gpu_tiny_preset_on_cpu():
    log = run("-m", "bench.gpu", "--preset=llama-tiny", "--device=cpu", "--kv_lengths=(64, 128)",
              "--ks=(1, 2, 16, 32)", "--reps=2", "--warmup=1", "--bandwidth=50")
    for kv in (64, 128):
        assert f"KV {kv}: NTP decode" in log
        assert f"KV {kv}: k-token forward / 1-token forward" in log
        assert f"KV {kv}: Eq. 16, k=16 in l=4 forwards" in log and f"KV {kv}: SDPA kernels" in log
    assert "a decode step reads" in log and "GB/s achieved" in log
