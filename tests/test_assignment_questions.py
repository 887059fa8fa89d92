"""
Staff only (STAFF_ONLY in assignments/assignments.py): the graded questions. Each answer is computed
again from the reference code (answer_N_I), checked against the digest assignments.py stores and
against answers_reference.toml, so that a change of the code cannot leave an answer stale; the
student's blank answers.toml scores 0, the reference's answers full points, a wrong answer 0.
"""

import dataclasses
import math
import os
import re

import torch
from test_assignments import (
    BY_NUMBER,
    IMPLEMENTED,
    REFERENCE_ANSWERS,
    ROOT,
    course,
    grader,
    writeup,
)

import decode
import model as model_lib
import sampling
import sbd
from pretrained.load_llama import hf_permute
from tiny_models import random_model


def two_outcome(h):
    """A distribution over two tokens (float64) with entropy h nats (0 <= h < log 2)."""
    lo, hi = 0.0, 0.5
    for _ in range(200):  # bisection on the smaller probability
        mid = (lo + hi) / 2
        if -(mid * math.log(mid) + (1 - mid) * math.log(1 - mid)) < h:
            lo = mid
        else:
            hi = mid
    return torch.tensor([1 - lo, lo], dtype=torch.float64)


ALL = torch.ones(1, 8, dtype=torch.bool)


def answer_1_1():  # the keys of noisy slot 10: L = 6, k = 3, phase 1
    mask = sbd.sbd_training_mask(torch.tensor(10), torch.arange(12), 6, 3, 1)  # (12,)
    return mask.nonzero()[:, 0].tolist()


def answer_1_2():  # True entries of the decoding mask: 3 cached, 2 committed, a block of 3
    mask = model_lib.dense_mask(lambda q, kv: sbd.hybrid_mask(q, kv, 5), 5, 8, query_offset=3)
    return int(mask.sum())


def answer_1_3():  # the noisy slots that see no clean key: L = 6, k = 3, phase 1
    q = torch.arange(6, 12)[:, None]
    mask = sbd.sbd_training_mask(q, torch.arange(6)[None, :], 6, 3, 1)
    return q[:, 0][~mask.any(dim=1)].tolist()


def answer_2_1():  # T and the noisy half's positions: L = 10, k = 4, phase 3, maskable from 6
    x = torch.arange(10, 20)[None]
    maskable = (torch.arange(10) >= 6)[None]
    idx, pos, _, _ = sbd.sbd_inputs(x, x + 1, 99, 4, torch.tensor([3]), maskable,
                                    torch.Generator().manual_seed(0))
    return [idx.size(1)] + pos[10:].tolist()


def answer_2_2():  # Eq. 14 at ntp_weight 1, 0.5, 0: clean nll 1, 2, 3; noisy nll 0.5, 1.5
    nll = {0: 1.0, 1: 2.0, 2: 3.0, 5: 0.5, 6: 1.5}  # slot: its loss; L = 4, T = 7
    labels, logits = torch.full((1, 7), -1), torch.zeros(1, 7, 2, dtype=torch.float64)
    for slot, value in nll.items():
        labels[0, slot] = 0
        logits[0, slot] = torch.tensor([-value, math.log(1 - math.exp(-value))])
    return [sbd.sbd_loss(logits, labels, 4, ntp_weight=w)[0].item() for w in (1.0, 0.5, 0.0)]


def answer_2_3():  # P(a block of 8 maskable tokens all masked): η ~ U(0, 1), η = 0.5
    _, is_masked = sbd.add_noise(torch.zeros(100_000, 8, dtype=torch.long), 1,
                                 generator=torch.Generator().manual_seed(0))
    assert abs(is_masked.all(dim=1).double().mean().item() - 1 / 9) < 0.005  # add_noise agrees
    return [1 / 9, 0.5 ** 8]  # the integral of η^8 over [0, 1], and 0.5^8


def answer_3_1():  # cache lengths after forwards (T, n_commit) on 5 of max_len 12; -1: refused
    cache = model_lib.KVCache(1, 1, 1, 2, max_len=12, device="cpu", dtype=torch.float32)
    cache.length, lengths = 5, []
    for T, n_commit in [(4, 2), (3, 0), (6, 3), (5, 5)]:
        try:
            cache.extend(0, torch.ones(1, 1, T, 2), torch.ones(1, 1, T, 2), n_commit)
        except ValueError:
            lengths.append(-1)
            continue
        cache.commit(n_commit)
        lengths.append(cache.length)
    return lengths


def answer_3_2():  # bytes of Llama-3.1-8B's bf16 KV cache: 8192 tokens, and a block of 16
    c = model_lib.LlamaConfig()
    per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2  # K and V, 2 bytes each
    return [8192 * per_token, 16 * per_token]


def answer_4_1():  # reveal_entropy on entropies [0.3, 0.05, 0.2, 0, 0.4, 0.1], γ = 0.3
    probs = torch.stack([two_outcome(h) for h in [0.3, 0.05, 0.2, 0.0, 0.4, 0.1]])[None]
    return sampling.reveal_entropy(probs, ALL[:, :6], 0.3)[0].nonzero()[:, 0].tolist()


def answer_4_2():  # Eq. 18 on entropies [0.1, 0.5, 0.2, 0.3] in confidence order, γ = 0.5
    h_sorted = torch.tensor([[0.1, 0.5, 0.2, 0.3]], dtype=torch.float64)
    return int(sampling.entropy_bound(h_sorted, ALL[:, :4], 0.5).sum())


def answer_4_3():  # the factor rule on confidences [0.99, 0.9, 0.95, 0.7, 0.85], f = 1
    probs = torch.tensor([[c, 1 - c] for c in [0.99, 0.9, 0.95, 0.7, 0.85]],
                         dtype=torch.float64)[None]
    return sampling.reveal_factor(probs, ALL[:, :5], 1.0)[0].nonzero()[:, 0].tolist()


def answer_5_1():  # widths of Algorithm 3's forwards: a second block of 8, fixed entropies, γ 0.12
    entropies = [0.0, 0.02, 0.5, 0.01, 0.3, 0.05, 0.9, 0.02]  # slot 0 comes from NTP
    probs = torch.stack([two_outcome(h) for h in entropies])[None]
    is_masked, widths = ALL.clone(), []
    is_masked[0, 0] = False
    while is_masked.any():
        widths.append(8 + 8 if not widths else 8)  # the first forward also commits the last block
        is_masked &= ~sampling.reveal_entropy(probs, is_masked, 0.12)
    return widths


def answer_5_2():  # Eq. 16, k = 16 in 4 forwards: time(n) flat, and time(16) 1.4, time(32) 1.9
    def speedup(k, forwards, time):
        return k * time(1) / (time(2 * k) + (forwards - 1) * time(k))

    return [speedup(16, 4, lambda n: 1.0), speedup(16, 4, {1: 1.0, 16: 1.4, 32: 1.9}.get)]


def answer_5_3():  # exact mode: drafts [5, 9, 2, 7], NTP's argmaxes [5, 9, 3, 7, 1]
    drafts, causal = torch.tensor([[5, 9, 2, 7]]), torch.zeros(1, 5, 12)
    causal[0, torch.arange(5), torch.tensor([5, 9, 3, 7, 1])] = 1.0
    ok, targets = decode.accept_greedy(drafts, causal, 11)
    n_ok = next((j for j, kept in enumerate(ok[0].tolist()) if not kept), 4)
    return drafts[0, :n_ok].tolist() + [int(targets[0, n_ok])]


def answer_5_4():  # cache.length after each forward: prompt of 6, k = 4, blocks in 3 and 2
    m = random_model("gpt-tiny")
    prompt = torch.randint(0, 60, (1, 6), generator=torch.Generator().manual_seed(0))
    cache = m.new_cache(1, prompt.size(1) + 8, prompt.device)
    prev = decode.prefill(m, prompt, cache)
    block, lengths = torch.full((1, 4), 63), []
    with torch.no_grad():
        for forwards in (3, 2):
            decode.hybrid_forward(m, cache, torch.cat([prev, block], dim=1), prev.size(1))
            lengths.append(cache.length)
            for _ in range(forwards - 1):
                decode.hybrid_forward(m, cache, block, 0)
                lengths.append(cache.length)
            prev = block
    return lengths


def answer_6_1():  # hf_permute's row order: 2 heads of head_dim 6
    return hf_permute(torch.arange(12.0)[:, None], 2)[:, 0].long().tolist()


def answer_6_2():  # Llama 3.1's scaling at head_dim 64: frequencies kept, interpolated, divided
    scaled = model_lib.LlamaConfig(dim=2048, n_heads=32)
    f = model_lib.rope_frequencies(scaled).double()
    base = model_lib.rope_frequencies(dataclasses.replace(scaled, use_scaled_rope=False)).double()
    kept = torch.isclose(f, base, rtol=1e-6)
    divided = torch.isclose(f, base / scaled.rope_scale_factor, rtol=1e-6)
    return [int(kept.sum()), int((~kept & ~divided).sum()), int(divided.sum())]


def answer_6_3():  # apply_rotary: x = [1, 0, 0, 1], frequencies [1, 0.5], position 3
    cos, sin = model_lib.rotary_cos_sin(torch.tensor([3]), torch.tensor([1.0, 0.5]))
    x = torch.tensor([1.0, 0.0, 0.0, 1.0]).view(1, 1, 1, 4)
    return model_lib.apply_rotary(x, cos, sin).flatten().tolist()


QUESTION_ANSWERS = {f"{name[7]}.{name[9]}": f for name, f in globals().items()
                    if re.fullmatch(r"answer_\d_\d", name)}


def reference_answers():
    return grader.read_answers(REFERENCE_ANSWERS)


def test_question_answers_are_the_reference_codes():
    """Every stored digest is that of the answer the reference code gives now (a change of the
    code that changes an answer fails here), and answers_reference.toml says the same."""
    stored = {qid: value for qid, value in reference_answers().items()
              if int(qid.split(".")[0]) in course.QUESTIONS}  # not the experiments' numbers
    questions = [q for n in IMPLEMENTED for q in course.QUESTIONS[n]]
    assert sorted(QUESTION_ANSWERS) == sorted(q["id"] for q in questions) == sorted(stored)
    for q in questions:
        text = grader.canonical(q["kind"], QUESTION_ANSWERS[q["id"]]())
        assert text == grader.canonical(q["kind"], stored[q["id"]]), q["id"]
        assert grader.digest(q, text) == q["digest"], f"question {q['id']}: the digest is stale"


def test_questions_are_asked_and_graded():
    """2-4 questions per implementation assignment, each asked in its write-up and blank in the
    student's answers.toml; the blank form earns 0, the reference's answers full points, and a
    wrong answer 0."""
    form = grader.read_answers(os.path.join(ROOT, "assignments", "answers.toml"))
    assert sorted(form) == sorted(reference_answers())
    assert all(value == [] for value in form.values())
    for n in IMPLEMENTED:
        a = BY_NUMBER[n]
        assert 2 <= len(course.QUESTIONS[n]) <= 4
        section = writeup(a).split("## Graded questions", 1)[1].split("\n## ", 1)[0]
        for q in course.QUESTIONS[n]:
            assert re.search(rf"^\*\*{re.escape(q['id'])}\*\* ", section, re.M), (
                f"{a['writeup']} does not ask question {q['id']}")
        assert sum(e["score"] for e in grader.grade_questions(a, form)) == 0
        entries = grader.grade_questions(a, reference_answers())
        assert all(e["score"] == e["max_score"] == 1 for e in entries)
        wrong = {qid: (v + 1 if not isinstance(v, list) else [v[0] + 1] + v[1:])
                 for qid, v in reference_answers().items()}
        assert sum(e["score"] for e in grader.grade_questions(a, wrong)) == 0
    assert grader.canonical("numbers:2", [-0.001, 2.0]) == "0.00,2.00"
    assert grader.canonical("ints", [1.5]) is None and grader.canonical("ints", "3") is None
