"""
How one SBD forward's logits become tokens: the decoding settings, the reveal rules that decide
which masked positions a forward reveals (docs/method.md, Reveal rules), the token choice (argmax,
or a draw with temperature, top-k and top-p). checkpoint.settings_for builds the settings of a
trained checkpoint.

    settings = DecodeSettings(mask_id=31, stop_ids=(30,), k=16, gamma=0.01)
    block, revealed, _ = reveal_step(logits, block, is_masked, settings)
"""

import dataclasses
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from configurator import check_decode_settings

ONE_FORWARD = 1e9  # a γ that reveals every masked slot at once, whatever the rule

@dataclass
class DecodeSettings:
    """How a model decodes, in one record (NTP uses the stop and mask tokens and the sampling).
    checkpoint.settings_for builds it from a checkpoint and its calibration."""

    mask_id: int  # the mask token: an input only, never emitted
    stop_ids: tuple = ()  # a row ends at its first stop token, which it keeps
    k: int = 16  # block size
    gamma: float = 0.1  # threshold of the reveal rule: γ of the EB-Sampler, f of the factor rule
    rule: str = "entropy"  # a key of REVEAL_RULES
    exact: bool = False  # exact SBD (decode.exact): drafts checked by NTP, the output is NTP's
    first_from_ntp: bool = True  # a block's slot 0 from the causal logits (False: no NTP term)
    token_shift: bool = False  # block slots aligned by token shift (sbd.read_at), not the paper
    temperature: float = 0.0  # 0: argmax (the paper's setting); > 0: sample
    top_k: int | None = None  # sample among the top_k most likely tokens only
    top_p: float | None = None  # sample among the smallest set holding probability top_p

    def __post_init__(self):
        self.stop_ids = tuple(self.stop_ids)
        check_decode_settings(self, sorted(REVEAL_RULES))  # each out-of-range value: one line

    def replace(self, **changes):
        """A copy with some fields changed (and checked again)."""
        return dataclasses.replace(self, **changes)


# -----------------------------------------------------------------------------
# reveal rules: (B, k, V) probabilities + (B, k) is_masked -> (B, k) reveal, a subset of is_masked
# with at least one position per row that has any mask. Vectorised over the batch: a per-row
# Python loop in the sampler costs more than the forwards it saves (docs/findings.md).


def entropy(probs):
    """Entropy of each position's distribution, (B, k, V) -> (B, k); 0 * log 0 counts as 0."""
    return torch.special.entr(probs).sum(-1)


def sort_masked(key, is_masked):
    """Sort each row's masked positions by key ascending, ties keeping the lower position first ->
    order (B, k), the block positions in that order with the unmasked ones last, and
    masked_sorted (B, k) bool, True where the sorted slot holds a masked position."""
    key = torch.where(is_masked, key, float("inf"))  # unmasked positions sort last
    order = torch.sort(key, dim=1, stable=True).indices  # (B, k)
    return order, is_masked.gather(1, order)


def unsort(accept_sorted, order):
    """Scatter a decision made in sorted order (B, k) back to block positions (B, k)."""
    return torch.zeros_like(accept_sorted).scatter(1, order, accept_sorted)


def entropy_bound(h_sorted, masked_sorted, gamma):
    """Eq. 8 / Eq. 18 on entropies in reveal order: reveal the first s masked slots, s >= 1 the
    largest count with H_(1) + ... + H_(s) - max(H_(1), ..., H_(s)) <= γ. Entropies are >= 0, so
    this spent budget never shrinks as s grows (the revealed slots are a prefix) and is 0 at s = 1
    (every row with a mask reveals one). In entropy order the largest of the first s is the s-th
    (Eq. 8); in confidence order it need not be (Eq. 18)."""
    h = torch.where(masked_sorted, h_sorted, 0.0)  # (B, k)
    before = F.pad(torch.cumsum(h, dim=1)[:, :-1], (1, 0))  # (B, k): sum of the slots ahead
    largest_before = F.pad(torch.cummax(h, dim=1).values[:, :-1], (1, 0))  # (B, k)
    # the sum up to s minus its largest term; in entropy order the correction is exactly 0
    spent = before + (h - largest_before).clamp(max=0)
    return masked_sorted & (spent <= gamma)


def reveal_entropy(probs, is_masked, gamma):
    """EB-Sampler with the entropy proxy (Ben-Hamu et al. 2025, Eq. 8), the SBD paper's default.
    Rule: sort the masked positions by entropy, lowest first (ties: lower position first). Reveal
    the s lowest, s >= 1 the largest count with H_(1) + ... + H_(s-1) <= γ, i.e. the revealed
    entropies minus the largest of them stay within the budget γ. γ = 0 reveals one token per
    forward (more only where the model is exactly certain); a huge γ reveals every masked position.
    """
    h = entropy(probs)  # (B, k)
    order, masked_sorted = sort_masked(h, is_masked)
    return unsort(entropy_bound(h.gather(1, order), masked_sorted, gamma), order)


def reveal_confidence(probs, is_masked, gamma):
    """EB-Sampler with the confidence proxy (Ben-Hamu et al. 2025, Eq. 18).
    Rule: sort the masked positions by confidence c = max_v p(v), highest first (ties: lower
    position first), then apply the same entropy bound to the entropies in that order: reveal the
    first s, s >= 1 the largest count with H_(1) + ... + H_(s) - max(H_(1), ..., H_(s)) <= γ.
    """
    order, masked_sorted = sort_masked(-probs.amax(-1), is_masked)
    return unsort(entropy_bound(entropy(probs).gather(1, order), masked_sorted, gamma), order)


def reveal_left(probs, is_masked, gamma):
    """The entropy bound with the masked positions taken left to right instead of by entropy.
    Rule: reveal the s leftmost masked positions, s >= 1 the largest count with
    H_(1) + ... + H_(s) - max(H_(1), ..., H_(s)) <= γ in position order. Exact sampling needs it:
    each draft must be drawn knowing only drafts to its left (docs/method.md, Exact sampling).
    """
    order, masked_sorted = sort_masked(torch.zeros_like(probs[..., 0]), is_masked)
    return unsort(entropy_bound(entropy(probs).gather(1, order), masked_sorted, gamma), order)


def reveal_factor(probs, is_masked, f):
    """Fast-dLLM's factor rule (Wu et al. 2025, arXiv:2505.22618; SBD paper appendix B.1).
    Rule: sort the masked positions by confidence c = max_v p(v), highest first (ties: lower
    position first); reveal the first n, n the largest count with (n + 1) * (1 - c_(n)) < f, and at
    least one. c_(n) falls and n + 1 grows along the order, so the accepted positions are a prefix.
    """
    conf = probs.amax(-1)  # (B, k)
    order, masked_sorted = sort_masked(-conf, is_masked)
    n = torch.arange(1, conf.size(1) + 1, device=conf.device)  # (k,): 1-based rank in the order
    passes = ((n + 1) * (1 - conf.gather(1, order)) < f) | (n == 1)  # (B, k)
    return unsort(masked_sorted & passes, order)


REVEAL_RULES = {"entropy": reveal_entropy, "confidence": reveal_confidence, "left": reveal_left,
                "factor": reveal_factor}

# -----------------------------------------------------------------------------
# token choice


def suppress_mask(logits, mask_id):
    """The mask token is an input, never an output: its logit becomes -inf before anything else."""
    if mask_id is not None:  # on a copy: the caller's logits stay as they were
        logits = logits.clone()
        logits[..., mask_id] = float("-inf")
    return logits


def keep_top_k(logits, top_k):
    """(..., V) logits with all but the top_k largest set to -inf."""
    kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits, top_p):
    """(..., V) logits with all but the smallest set of tokens whose probability reaches top_p
    set to -inf (nucleus sampling)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(-1) - probs >= top_p  # the mass before a token already reached p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back in place
    return logits.masked_fill(drop, float("-inf"))


def sample(probs, generator=None):
    """(..., V) probabilities -> (...) one token drawn from each distribution."""
    flat = probs.reshape(-1, probs.size(-1))  # (N, V)
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def greedy(logits):
    """(..., V) logits -> (...) argmax, ties to the lowest id (max's indices: a third of argmax's
    time on a CPU at SmolLM2's 49152 tokens)."""
    return logits.max(-1).indices


def sampling_probs(logits, settings):
    """(..., V) logits, the mask token's suppressed -> the distribution a draw at the settings'
    temperature (> 0), top_k and top_p comes from. NTP, the drafts and exact SBD's acceptance rule
    all draw from it, so p and q are filtered alike."""
    logits = logits.float() / settings.temperature
    logits = logits if settings.top_k is None else keep_top_k(logits, settings.top_k)
    logits = logits if settings.top_p is None else keep_top_p(logits, settings.top_p)
    return F.softmax(logits, dim=-1)


def next_token(causal_logits, settings, generator=None):
    """(B, V) next-token logits -> (B,) the token NTP decoding would emit there: the argmax at
    temperature 0 (the paper's setting), else a draw from sampling_probs."""
    logits = suppress_mask(causal_logits, settings.mask_id)
    if settings.temperature == 0:
        return greedy(logits)
    return sample(sampling_probs(logits, settings), generator)


def reveal_step(logits, block, is_masked, settings, generator=None):
    """One forward's block logits (B, k, V) -> (new block (B, k), revealed (B, k) bool, q (B, k,
    V): what each token was drawn from, for exact SBD's check; None at temperature 0). Which to
    reveal is decided on the temperature-1 distribution, whatever the sampling temperature."""
    s, logits = settings, suppress_mask(logits, settings.mask_id)
    q = None if s.temperature == 0 else sampling_probs(logits, s)  # (B, k, V)
    tokens = greedy(logits) if q is None else sample(q, generator)  # (B, k): next_token's choice
    if s.gamma >= ONE_FORWARD:  # no rule's budget is spent (k ln V of entropy is far below it)
        revealed = is_masked.clone()
    else:
        probs = F.softmax(logits.float(), dim=-1)  # (B, k, V)
        revealed = REVEAL_RULES[s.rule](probs, is_masked, s.gamma)  # (B, k)
    return torch.where(revealed, tokens, block), revealed, q
