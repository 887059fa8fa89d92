"""
The block adapter (train.py adapter_rank; docs/method.md, Block adapter): a low-rank delta and a
mask embedding that only the block's slots see. Checked against independent definitions:
- the gate written out by hand for small training layouts and decoding forwards;
- the adapted model's causal logits against the base model's, bit for bit in fp32;
- cached against uncached forwards with the gate (the hybrid mask written out here);
- exact SBD against the base model's NTP decoding per row, and in distribution when sampling;
- the fast training step (sbd.adapter_loss) against the one-forward loss, gradients included;
- the gradient of a step, which must reach no base weight;
- train.py end to end: the adapter alone saved, loaded on its base, refused on another.
"""

import copy
import math
import os

import pytest
import torch
from test_exact_serving import (
    chi_square_bound,
    enumerate_ntp,
    sampled_histogram,
    statistic,
    tiny_sampling_model,
)
from test_fast_decode import q4_1_model
from test_training import RESUME, TINY, read_log, train

import checkpoint as checkpoint_lib
import decode
import evaluate
import model as model_lib
import sbd
import tiny_models
from checkpoint import settings_for
from configurator import ConfigError
from model import attach_adapter
from sampling import DecodeSettings
from sbd import freeze_base, is_adapter
from serving import batched, exact
from serving.layout import lay_out_for_decoding
from serving.settings import ServingSettings

FAMILIES = ["gpt-tiny", "llama-tiny"]


def mask_id_of(m):
    return m.config.vocab_size - 1


def adapted(family, rank=4, layers="all", seed=0):
    """(base, the same base with a block adapter whose every parameter is random, not the
    zero-delta start: a gate that leaked anywhere would show)."""
    base = tiny_models.random_model(family, seed, std=0.5, dtype=torch.float64)
    m = attach_adapter(copy.deepcopy(base), rank, layers, mask_id_of(base)).double()
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if is_adapter(name):
                p.normal_(0.0, 0.5)
    return base, m.eval()


def tokens(m, B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, mask_id_of(m), (B, T), generator=g)


# -----------------------------------------------------------------------------
# the gate, by hand


def test_the_gate_of_a_training_layout_is_its_noisy_copies():
    """L = 4, noisy start 2, two copies: slots 0-3 clean, 4-5 and 6-7 noisy."""
    m = attach_adapter(tiny_models.random_model("gpt-tiny"), 2, "all", 63)
    idx = torch.zeros(1, 8, dtype=torch.long)
    gate = model_lib.block_gate(m, idx, None, 4)
    assert gate.int().tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    copy_, _ = sbd.slot_layout(torch.arange(8), 4, 2)
    assert gate[0].tolist() == (copy_ > 0).tolist()  # the layout's noisy copies, by one rule


def test_the_gate_of_a_decoding_forward_is_its_block_per_row():
    """Row 0 has 5 cached tokens and commits 2 before a block of 3; row 1 has 3 cached and
    commits 1: its block starts one slot earlier in the forward."""
    m = attach_adapter(tiny_models.random_model("gpt-tiny"), 2, "all", 63)
    cache = m.new_cache(2, 16, "cpu")
    cache.lengths = torch.tensor([5, 3])
    block_start = (cache.lengths + torch.tensor([2, 1]))[:, None]  # (B, 1)
    gate = model_lib.block_gate(m, torch.zeros(2, 5, dtype=torch.long), cache, block_start)
    assert gate.int().tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]]


def test_no_adapter_or_no_block_means_no_gate():
    m = tiny_models.random_model("gpt-tiny")
    idx = torch.zeros(1, 4, dtype=torch.long)
    assert model_lib.block_gate(m, idx, None, 2) is None
    attach_adapter(m, 2, "all", 63)
    assert model_lib.block_gate(m, idx, None, None) is None


# -----------------------------------------------------------------------------
# the next-token path is the base model's


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layers", ["all", "attention", "mlp"])
def test_causal_logits_are_the_base_models_bit_for_bit(family, layers):
    """fp32, any sequence, the mask token included: without a block (every causal forward) and
    before the block's first slot, the adapted model computes the base model's logits exactly;
    from it on they differ."""
    base, m = adapted(family, layers=layers)
    base, m = base.float(), m.float()
    idx = tokens(m, 2, 12)
    idx[:, 3] = mask_id_of(m)  # the mask token in the causal part: still the base's embedding
    reference, _ = base(idx)
    assert torch.equal(m(idx)[0], reference)
    assert torch.equal(m(idx, block_start=12)[0], reference)
    mask = sbd.hybrid_mask(torch.arange(12)[:, None], torch.arange(12), 8)  # block: slots 8-11
    with_block, _ = m(idx, mask=mask, block_start=8)
    base_block, _ = base(idx, mask=mask)  # the same forward through the base weights alone
    assert torch.equal(with_block[:, :8], base_block[:, :8])
    assert (with_block[:, 8:] - base_block[:, 8:]).abs().amax(-1).min() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mask_embedding_is_the_adapters_inside_the_block_only(family):
    base, m = adapted(family)
    m.block_adapter.mask_embedding.data.zero_()
    emb = m.embedding.weight[mask_id_of(m)]
    idx = torch.full((1, 4), mask_id_of(m))
    x = model_lib.adapted_embedding(m, idx, model_lib.block_gate(m, idx, None, 2))
    assert torch.equal(x[0, :2], emb.expand(2, -1)) and not x[0, 2:].any()


# -----------------------------------------------------------------------------
# cached == uncached, exact SBD == the base's NTP


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_block_forward_equals_the_uncached_one(family):
    """A 5-token prefix in the cache, then [2 committed ; block of 4]: the same logits as one
    uncached forward of all 11 tokens under the hybrid mask written out here, block from slot 7."""
    _, m = adapted(family)
    idx = tokens(m, 2, 11, seed=3)
    idx[:, 8] = mask_id_of(m)
    cache = m.new_cache(2, 16, "cpu", torch.float64)
    with torch.no_grad():
        m(idx[:, :5], cache=cache)
        cached = decode.hybrid_forward(m, cache, idx[:, 5:], 2)
        mask = torch.tensor([[j <= i or i >= 7 for j in range(11)] for i in range(11)])
        full, _ = m(idx, mask=mask, block_start=7)
    assert cache.lengths.tolist() == [7, 7]
    assert torch.allclose(cached, full[:, 5:], atol=1e-10)


def adapter_checkpoint(m, token_shift):
    config = dict(token_shift=token_shift, ntp_weight=1.0)
    return dict(mask_id=mask_id_of(m), stop_ids=[], stage="sbd", config=config,
                adapter=dict(rank=4, layers="all", mask_id=mask_id_of(m)))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("token_shift", [False, True])
@pytest.mark.parametrize("adaptive", [False, True])
def test_exact_sbd_is_the_base_models_ntp_per_row(family, token_shift, adaptive):
    """Batch 4, rows at different cache lengths: every row is the base model's NTP decoding of it
    alone, under either alignment. The adapter's drafts differ from the base's (some are kept,
    some rejected), so the check is not vacuous."""
    base, m = adapted(family)
    prompts = tokens(m, 4, 5, seed=11)
    ntp, _ = tiny_models.ntp(base, prompts, 30, mask_id=mask_id_of(m))
    settings = settings_for(adapter_checkpoint(m, token_shift), k=8, gamma=1e9, exact=True,
                            adaptive=adaptive)
    assert settings.first_from_ntp and settings.token_shift == token_shift
    out, stats = exact.exact_generate(m, prompts, settings, 30)
    assert out == ntp
    assert sum(stats.rejected) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_sbd_reads_the_adapter(family):
    """Plain SBD through the adapter decodes other tokens than through the base model: the
    decoders pass the block to the model."""
    base, m = adapted(family)
    prompts = tokens(m, 2, 5, seed=4)
    settings = DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9)
    assert (batched.sbd_generate(m, prompts, settings, 16)[0]
            != batched.sbd_generate(base, prompts, settings, 16)[0])


def test_exact_sampling_with_an_adapter_is_distributed_as_the_bases_ntp():
    base = tiny_sampling_model()
    m = attach_adapter(copy.deepcopy(base), 4, "all", 5).double()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if is_adapter(name):
                p.normal_(0.0, 0.7)
    prompt, n = [1, 2, 3], 3
    probs = enumerate_ntp(base, prompt, n, 5)
    for token_shift in (False, True):
        settings = DecodeSettings(mask_id=5, k=3, gamma=1e9, rule="left", exact=True,
                                  temperature=1.0, token_shift=token_shift)
        value, dof = statistic(sampled_histogram(m, prompt, n, settings), probs)
        assert dof >= 10 and value < chi_square_bound(dof), token_shift


@pytest.mark.parametrize("family", FAMILIES)
def test_laid_out_weights_keep_the_adapter(family):
    """The decode layout fuses the adapted layers' deltas with their weights: fp32 logits of a
    block forward agree with the model as trained, and exact SBD decodes the base's NTP."""
    base, m = adapted(family)
    m, base = m.float(), base.float()
    idx = tokens(m, 2, 10)
    mask = sbd.hybrid_mask(torch.arange(10)[:, None], torch.arange(10), 6)
    reference, _ = m(idx, mask=mask, block_start=6)
    fast = lay_out_for_decoding(copy.deepcopy(m), torch.float32)
    assert torch.allclose(fast(idx, mask=mask, block_start=6)[0], reference, atol=1e-4)
    p = tokens(m, 2, 5, seed=2)
    settings = DecodeSettings(mask_id=mask_id_of(m), k=4, gamma=1e9, exact=True)
    ntp, _ = tiny_models.ntp(base, p, 16, mask_id=mask_id_of(m))
    assert exact.exact_generate(fast, p, settings, 16)[0] == ntp


def test_int8_layout_keeps_the_adapter():
    """int8 weights for 1-row forwards, the dense copy for blocks: exact SBD still decodes what
    NTP decodes on the same laid-out model, drafts from the adapter."""
    _, m = adapted("llama-tiny")
    fast = lay_out_for_decoding(m.float(), torch.float32, "int8", 1)
    assert fast.layers[0].attention.wqkv.delta is not None
    p = tokens(fast, 2, 5, seed=5)
    settings = DecodeSettings(mask_id=mask_id_of(fast), k=4, gamma=1e9, exact=True)
    ntp, _ = tiny_models.ntp(fast, p, 16, mask_id=mask_id_of(fast))
    assert exact.exact_generate(fast, p, settings, 16)[0] == ntp


def test_int4_layout_keeps_the_adapter():
    """A model on the GGUF Q4_1 grid, every width read from its 4-bit blocks: the adapted layers'
    deltas still reach the block (other drafts than the base's), and exact SBD decodes the base's
    NTP on the same layout."""
    base = q4_1_model("llama-tiny")
    m = attach_adapter(copy.deepcopy(base), 4, "all", mask_id_of(base))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if is_adapter(name):
                p.normal_(0.0, 0.5)
    fast = lay_out_for_decoding(m, torch.float32, "int4", math.inf, four_bit=True)
    fast_base = lay_out_for_decoding(base, torch.float32, "int4", math.inf, four_bit=True)
    p = tokens(fast, 2, 5, seed=6)
    settings = DecodeSettings(mask_id=mask_id_of(fast), k=4, gamma=1e9, exact=True)
    ntp, _ = tiny_models.ntp(fast_base, p, 16, mask_id=mask_id_of(fast))
    assert exact.exact_generate(fast, p, settings, 16)[0] == ntp
    plain = DecodeSettings(mask_id=mask_id_of(fast), k=8, gamma=1e9)
    assert (batched.sbd_generate(fast, p, plain, 16)[0]
            != batched.sbd_generate(fast_base, p, plain, 16)[0])


# -----------------------------------------------------------------------------
# training


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cached_clean_half_gives_the_one_forward_loss_and_gradients(family):
    """sbd.adapter_loss == Eq. 14's masked-token term from one forward over both halves (what
    train.py computes with attention='flex'), value and adapter gradients."""
    _, m = adapted(family)
    m.train()
    freeze_base(m)
    x = tokens(m, 3, 12, seed=7)
    answer = torch.arange(12)[None].expand(3, -1) >= 4
    phases = sbd.block_phases(answer, 4, "answer")
    idx, pos, mask, labels = sbd.sbd_inputs(x, x, mask_id_of(m), 4, phases, answer,
                                            torch.Generator().manual_seed(0), token_shift=True)
    at = labels != model_lib.IGNORE_INDEX
    logits, _ = m(idx, pos=pos, mask=mask, at=at, block_start=12)
    reference = sbd.sbd_loss(logits, labels, 12, ntp_weight=0.0)[0]
    expected = torch.autograd.grad(reference, [p for p in m.parameters() if p.requires_grad])
    cache = m.new_cache(3, idx.size(1), "cpu", torch.float64)
    loss, ntp, masked = sbd.adapter_loss(m, cache, idx, pos, mask, labels, 12, at)
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad])
    assert torch.allclose(loss, reference, atol=1e-10) and masked == loss.detach()
    assert all(torch.allclose(a, b, atol=1e-9) for a, b in zip(grads, expected))
    assert ntp > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_the_gradient_reaches_no_base_weight(family):
    _, m = adapted(family)
    m.train()
    freeze_base(m)
    x = tokens(m, 2, 10)
    answer = torch.ones_like(x, dtype=torch.bool)
    idx, pos, mask, labels = sbd.sbd_inputs(x, x, mask_id_of(m), 4, torch.tensor([0, 1]), answer,
                                            torch.Generator().manual_seed(1))
    cache = m.new_cache(2, idx.size(1), "cpu", torch.float64)
    sbd.adapter_loss(m, cache, idx, pos, mask, labels, 10)[0].backward()
    for name, p in m.named_parameters():
        if is_adapter(name):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None and not p.requires_grad, name


@pytest.mark.parametrize("rank, layers, message", [
    (0, "all", "between 1 and"), (33, "all", "between 1 and"), (4, "heads", "adapter_layers")])
def test_bad_adapter_settings_are_one_line_errors(rank, layers, message):
    m = tiny_models.random_model("gpt-tiny")  # n_embd 32: no rank above 32
    with pytest.raises(ConfigError, match=message) as e:
        attach_adapter(m, rank, layers, 63)
    assert "\n" not in str(e.value)


ADAPTER = ["--adapter_rank=4", "--sbd_starts_from=ntp"]


@pytest.mark.parametrize("args, message", [
    (["--adapter_rank=4", "--sbd_iters=0"], "needs sbd_iters > 0"),
    (["--adapter_rank=-1"], "adapter_rank=-1"),
    (["--adapter_rank=4", "--sbd_starts_from=init"], "sbd_starts_from"),
    (["--adapter_only=True"], "adapter_only"),
])
def test_train_refuses_an_adapter_without_an_sbd_stage(args, message, tmp_path):
    run = train(f"--out_dir={tmp_path}", *TINY, *args)
    assert run.returncode != 0 and message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_train_saves_the_adapter_alone_and_loads_it_on_its_base_only(tmp_path):
    """Both stages with adapter_only: ckpt_sbd.pt holds the adapter alone (smaller than
    ckpt_ntp.pt), loads on ckpt_ntp.pt with the NTP model's causal logits and other block
    logits, and is refused once ckpt_ntp.pt's weights change."""
    out = str(tmp_path)
    run = train(f"--out_dir={out}", "--ntp_iters=4", "--sbd_iters=4", *TINY, *ADAPTER,
                "--adapter_only=True", "--report=False", "--eval_interval=4")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "block adapter: rank 4" in run.stdout
    assert os.path.getsize(f"{out}/ckpt_sbd.pt") < os.path.getsize(f"{out}/ckpt_ntp.pt") / 2
    sbd_model, checkpoint = checkpoint_lib.load_checkpoint(f"{out}/ckpt_sbd.pt")
    ntp_model, _ = checkpoint_lib.load_checkpoint(f"{out}/ckpt_ntp.pt")
    assert checkpoint["adapter"]["rank"] == 4 and "base" in checkpoint
    assert not any(is_adapter(name) for name in torch.load(
        f"{out}/ckpt_ntp.pt", weights_only=False)["model"])
    idx = torch.randint(0, 10, (2, 12))
    assert torch.equal(sbd_model(idx)[0], ntp_model(idx)[0])
    assert not torch.equal(sbd_model(idx, block_start=6)[0], ntp_model(idx)[0])
    base = torch.load(f"{out}/ckpt_ntp.pt", weights_only=False)
    name = next(iter(base["model"]))
    base["model"][name] = base["model"][name] + 1.0
    checkpoint_lib.save_checkpoint(base, f"{out}/ckpt_ntp.pt")
    with pytest.raises(ConfigError, match="fingerprints differ"):
        checkpoint_lib.load_checkpoint(f"{out}/ckpt_sbd.pt")


@pytest.mark.slow
@pytest.mark.parametrize("halt_after", [4, 6])
def test_resume_with_an_adapter_is_exact(tmp_path, halt_after):
    """Halted at the stage switch or inside the SBD stage, then resumed: the same log and
    weights as the run never halted."""
    args = [*RESUME, *ADAPTER]
    straight, halted = str(tmp_path / "straight"), str(tmp_path / "halted")
    assert train(f"--out_dir={straight}", *args).returncode == 0
    first = train(f"--out_dir={halted}", *args, f"--halt_after={halt_after}")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(f"--out_dir={halted}", *args, "--init_from=resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert read_log(halted) == read_log(straight)
    other = train(f"--out_dir={halted}", *args, "--init_from=resume", "--adapter_rank=8")
    assert other.returncode != 0 and "use the run's original config" in other.stderr
    for name in ("ckpt_ntp.pt", "ckpt_sbd.pt"):
        resumed = torch.load(f"{halted}/{name}", weights_only=False)["model"]
        expected = torch.load(f"{straight}/{name}", weights_only=False)["model"]
        assert resumed.keys() == expected.keys()
        assert all(torch.equal(resumed[key], expected[key]) for key in expected), name


@pytest.mark.compile
def test_compiled_decoding_with_an_adapter_gives_the_eager_tokens():
    """The compiled step computes the delta on every row and keeps it where gated (static
    shapes): NTP, plain SBD and exact SBD (batch 2, rows at different lengths) decode the eager
    tokens, and exact SBD the base model's NTP."""
    base, m = adapted("llama-tiny")
    m, base = lay_out_for_decoding(m.float(), torch.float32), base.float()
    p = tokens(m, 2, 5, seed=1)
    plain = ServingSettings(mask_id=mask_id_of(m), k=4, gamma=0.5)
    runs = [(batched.ntp_generate, plain), (batched.sbd_generate, plain),
            (exact.exact_generate, plain.replace(gamma=1e9, exact=True))]
    for run, settings in runs:
        eager, _ = run(m, p, settings, 12)
        compiled, _ = run(m, p, settings.replace(compiled=True), 12)
        assert compiled == eager, run.__name__
    assert compiled == tiny_models.ntp(base, p, 12, mask_id=mask_id_of(m))[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_report_decodes_an_adapters_ntp_once_only_on_its_own_base(family):
    base, m = adapted(family)
    assert evaluate.shares_next_token_path(base, m)  # the SBD model's NTP decoding: the base's
    assert not evaluate.shares_next_token_path(base, base)  # a full fine-tune: decoded apart
    other = copy.deepcopy(base)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1e-6
    assert not evaluate.shares_next_token_path(other, m)  # another base: decoded apart
