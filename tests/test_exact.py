"""
Exact SBD decoding (exact.exact_generate), checked against plain greedy NTP decoding of the same
model.

Random tiny models draft badly, so their drafts are rejected all the time: the tests below see
hundreds of rejections and corrections, and the output must still be NTP's token for token. A
scripted model whose drafts are right except at one chosen position checks that a wrong draft is
caught exactly there. Models are in float64 so that no argmax can flip on rounding between the
cached NTP path and the exact path.
"""

import functools
from types import SimpleNamespace

import pytest
import torch

import sampling
import tiny_models
from serving import batched, exact
from serving.settings import ServingSettings

FAMILIES = ["gpt-tiny", "llama-tiny"]


def random_model(family, seed=0):
    return tiny_models.random_model(family, seed, std=0.5, dtype=torch.float64)


def mask_id_of(m):
    return m.config.vocab_size - 1


def prompt_and_stop(m, seed, T0=5):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, m.config.vocab_size - 1, (1, T0), generator=g)
    stop = int(torch.randint(0, m.config.vocab_size - 1, (1,), generator=g))
    return prompt, stop


def commit_forwards(stats, row=0):
    """The forwards in which `row` committed tokens, each with its check, its block after the
    forward (tokens, 1-D) and what the forward revealed."""
    return [SimpleNamespace(check=s.check[row], tokens=s.tokens[row], revealed=s.revealed[row])
            for s in stats.steps if s.check is not None and s.check[row] is not None]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k", [1, 4, 16])
def test_exact_equals_greedy_ntp(family, k):
    total_rejected = 0
    for seed in range(2):
        m = random_model(family, seed)
        for p in range(3):
            prompt, stop = prompt_and_stop(m, p)
            for stop_ids in ([], [stop]):
                ntp, _ = tiny_models.ntp(m, prompt, 24, stop_ids, mask_id=mask_id_of(m))
                for gamma in (0.0, 0.1, 1e9):
                    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=k, gamma=gamma,
                                                       stop_ids=stop_ids, exact=True)
                    out, stats = exact.exact_generate(m, prompt, settings, 24, record_steps=True)
                    assert out == ntp, f"seed {seed} prompt {p} γ={gamma} stop {stop_ids}"
                    assert stats.tokens == [len(ntp[0])]
                    assert stats.nfe == [len(stats.steps)], "one recorded step per forward"
                    total_rejected += stats.rejected[0]
    if k > 1:
        assert total_rejected > 50, (
            "random drafts must really be rejected, or this test checks nothing")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_commit_forward_yields_a_checked_token(family):
    m = random_model(family)
    for p in range(3):
        prompt, stop = prompt_and_stop(m, p)
        for k, gamma in ((4, 0.0), (16, 0.1), (16, 1e9)):
            settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=k, gamma=gamma,
                                               stop_ids=[stop], exact=True)
            out, stats = exact.exact_generate(m, prompt, settings, 30, record_steps=True)
            checks = commit_forwards(stats)
            # kept drafts + (the correction, or the next block's first token from NTP)
            for step in checks:
                from_ntp = step.check.correction is not None or step.tokens.numel() > 0
                gained = len(step.check.kept) + from_ntp
                assert gained >= 1
            assert len(checks) <= stats.tokens[0] + stats.final_checks[0]
            # tokens = drafts NTP confirmed + NTP's own tokens (first tokens of blocks, corrections)
            n_first = sum(1 for s in checks if s.tokens.numel() > 0)
            n_corrections = sum(1 for s in checks if s.check.correction is not None)
            assert stats.tokens[0] == stats.accepted[0] + n_first + n_corrections
            assert stats.rejected[0] == sum(len(s.check.rejected) for s in checks)
            if gamma == 1e9:  # one forward per block: no forward can go to waste entirely
                assert stats.nfe[0] <= stats.tokens[0] + stats.final_checks[0]


class ScriptedDrafts(torch.nn.Module):
    """A model whose causal logits are the real model's, and whose block slots predict, with
    certainty, the greedy NTP token at their position (`script`, indexed by position) — except at
    position `wrong_at`, where they predict another token. Decoding it exactly must reject exactly
    one draft, at wrong_at. unsure=True: the wrong draft there ties with a second wrong token, so
    the head gives it probability 1/2."""

    def __init__(self, inner, script, wrong_at, unsure=False):
        super().__init__()
        self.inner, self.script, self.wrong_at, self.unsure = inner, script, wrong_at, unsure
        self.config, self.max_seq_len = inner.config, inner.max_seq_len

    def new_cache(self, *args, **kwargs):
        return self.inner.new_cache(*args, **kwargs)

    def forward(self, idx, pos=None, mask=None, cache=None, n_commit=None, block_start=None):
        n_commit = idx.size(1) if n_commit is None else n_commit  # the prefill commits everything
        if pos is None:  # the default: slot positions
            pos = torch.arange(cache.length, cache.length + idx.size(1))
        positions = pos.reshape(-1, idx.size(1))[0].tolist()  # one row
        logits, loss = self.inner(idx, pos=pos, mask=mask, cache=cache, n_commit=n_commit)
        logits = logits.clone()
        for i in range(idx.size(1) - n_commit):
            position = positions[n_commit + i]
            token = self.script[position]
            logits[:, n_commit + i] = -1e4
            if position == self.wrong_at:
                token = (token + 1) % (self.config.vocab_size - 1)
                if self.unsure:  # another wrong token, as likely, after it
                    logits[:, n_commit + i, (token + 1) % (self.config.vocab_size - 1)] = 1e4
            logits[:, n_commit + i, token] = 1e4
        return logits, loss


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("wrong", [1, 5, 17])
def test_a_wrong_draft_is_caught_and_corrected_where_it_is(family, wrong):
    m = random_model(family)
    prompt, _ = prompt_and_stop(m, 0)
    T0, n = prompt.size(1), 30
    ntp, _ = tiny_models.ntp(m, prompt, n, mask_id=mask_id_of(m))
    script = prompt[0].tolist() + ntp[0] + [0] * 8
    scripted = ScriptedDrafts(m, script, wrong_at=T0 + wrong)
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9, exact=True)
    out, stats = exact.exact_generate(scripted, prompt, settings, n, record_steps=True)
    assert out == ntp
    rejections = [s.check for s in commit_forwards(stats) if s.check.correction is not None]
    assert len(rejections) == 1
    check = rejections[0]
    assert check.start + len(check.kept) == wrong  # the first rejected draft is the wrong one...
    assert check.correction == ntp[0][wrong]  # ...and NTP's token takes its place
    assert check.rejected[0] == (ntp[0][wrong] + 1) % (m.config.vocab_size - 1)
    assert stats.rejected[0] == len(check.rejected) and stats.wasted_forwards == [0]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rule", ["host", "tensor"])
def test_an_unsure_draft_and_those_after_it_are_not_checked(family, rule, monkeypatch):
    """min_draft_prob: the block is cut before its first draft whose head probability is below
    it. The wrong draft at `wrong` is unsure (p = 1/2): at min_draft_prob 0.9 it and the sure
    drafts after it in its block go unchecked, so nothing is rejected and the block ends before
    it; at 0.4 it is checked and rejected as usual. Both on the host-list path and the tensor
    path (tensor_state; the step view's checks always come from it)."""
    if rule == "tensor":
        monkeypatch.setattr(exact, "Rows", functools.partial(exact.Rows, tensor_state=True))
    m = random_model(family)
    prompt, _ = prompt_and_stop(m, 0)
    T0, n, wrong = prompt.size(1), 30, 11
    ntp, _ = tiny_models.ntp(m, prompt, n, mask_id=mask_id_of(m))
    scripted = ScriptedDrafts(m, prompt[0].tolist() + ntp[0] + [0] * 8, T0 + wrong, unsure=True)
    for floor, rejections in ((0.9, 0), (0.4, 1)):
        settings = ServingSettings(mask_id=mask_id_of(m), k=8, gamma=1e9, exact=True,
                                           min_draft_prob=floor)
        out, stats = exact.exact_generate(scripted, prompt, settings, n)
        assert out == ntp
        assert stats.rejected == [rejections * 5]  # the rejected draft and the 4 after it
        # at 0.9 the block holding `wrong` (tokens 8..15) is checked up to token 10 only
        assert stats.unchecked == [(15 - wrong + 1) * (rejections == 0)]
        _, viewed = exact.exact_generate(scripted, prompt, settings, n, record_steps=True)
        checks = [s.check for s in commit_forwards(viewed)]
        assert any(c.start + len(c.kept) == wrong and bool(c.rejected) == bool(rejections)
                   for c in checks)


def test_wasted_forwards_count_forwards_whose_reveals_all_went():
    """γ = 0 reveals one draft per forward in entropy order; drafts of a random model are rejected
    early, so the forwards that revealed only rejected slots are wasted, and they are at most the
    block's forwards."""
    m = random_model("gpt-tiny")
    prompt, _ = prompt_and_stop(m, 1)
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=0.0, exact=True)
    _, stats = exact.exact_generate(m, prompt, settings, 24, record_steps=True)
    assert 0 < stats.wasted_forwards[0] < stats.nfe[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_after_exact_decoding_equals_ntp_cache(family, monkeypatch):
    m = random_model(family)
    prompt, stop = prompt_and_stop(m, 2)
    caches, new_cache = [], m.new_cache

    def keep(*args, **kwargs):
        caches.append(new_cache(*args, **kwargs))
        return caches[-1]

    monkeypatch.setattr(m, "new_cache", keep)
    ntp, _ = tiny_models.ntp(m, prompt, 24, mask_id=mask_id_of(m))
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=0.5, exact=True)
    out, stats = exact.exact_generate(m, prompt, settings, 24)
    assert out == ntp and stats.rejected[0] > 0  # rejections happened, so the cache was cut back
    ntp_cache, exact_cache = caches
    n = min(ntp_cache.length, int(exact_cache.lengths[0]))
    assert n >= prompt.size(1) + 24 - 1  # every emitted token but the last was committed
    for a, b in zip(ntp_cache.k + ntp_cache.v, exact_cache.k + exact_cache.v):
        assert torch.allclose(a[:, :, :n], b[:, :, :n], atol=1e-10)


def test_max_new_tokens_and_stop_as_plain_mode():
    m = random_model("llama-tiny")
    prompt, stop = prompt_and_stop(m, 3)
    for n in (1, 2, 7, 16, 17):
        settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=16, gamma=1e9, exact=True)
        out, stats = exact.exact_generate(m, prompt, settings, n)
        assert len(out[0]) == n == stats.tokens[0]
    ntp, _ = tiny_models.ntp(m, prompt, 40, [stop], mask_id=mask_id_of(m))
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=16, gamma=1e9, stop_ids=[stop],
                                       exact=True)
    out, _ = exact.exact_generate(m, prompt, settings, 40)
    assert out == ntp


def test_exact_step_view_marks_rejections():
    m = random_model("gpt-tiny")
    prompt, _ = prompt_and_stop(m, 0)
    settings = sampling.DecodeSettings(mask_id=mask_id_of(m), k=8, gamma=1e9, exact=True)
    _, stats = exact.exact_generate(m, prompt, settings, 20, record_steps=True)
    letters = lambda ids: "".join(chr(65 + i % 26) for i in ids)
    text = batched.format_steps(stats.steps, letters, mask_id_of(m))
    assert len(text.splitlines()) == stats.nfe[0]
    assert "~" in text and "{" in text and "checks tokens" in text


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=0.7), "left to right"),
    (dict(max_new_tokens=0), "max_new_tokens must be at least 1"),
    (dict(mask_id=None), "outside"),
])
def test_exact_errors(kwargs, message):
    m = random_model("gpt-tiny")
    n = kwargs.pop("max_new_tokens", 8)
    with pytest.raises(ValueError, match=message):
        defaults = dict(k=4, gamma=0.1, mask_id=mask_id_of(m), exact=True)
        settings = sampling.DecodeSettings(**{**defaults, **kwargs})
        exact.exact_generate(m, torch.zeros(1, 3, dtype=torch.long), settings, n)


