"""HFTokenizer against the `tokenizers` package (skipped without it): a byte-level BPE trained by
`tokenizers` on a small corpus, with Qwen's split regex and NFC (or SmolLM2's digits-then-GPT-2
split), special tokens and Qwen-3-like added tokens that are not special (<think>), saved as
tokenizer.json, must encode 1000 random strings (letters of several scripts, digits, whitespace
runs, contractions, combining marks) to the ids `tokenizers` gives; and refuse what it cannot
compute with an error naming the key."""

import json
import random

import pytest

from pretrained.hf_tokenizer import HFTokenizer
from pretrained.tokenizer import QWEN2_PAT_STR

tokenizers = pytest.importorskip("tokenizers")
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog's", "I'm", "they'll",
         "we've", "naïve", "café", "Straße", "日本語", "テキスト", "Привет", "мир", "ΣΑΣ", "def",
         "return", "x**2", "12345", "3.14159", "2024-01-01", "😀", "e\u0301", "٣٤٥", "²³"]
PIECES = [*WORDS, " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "'S", "'LL", "<think>",
          "</think>", "0", "7", "!", "?", ".", ",", "-", "_", "(", ")", "#"]


def corpus(n=400, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(5, 40))) for _ in range(n)]


def train(kind, path):
    """A tokenizer.json trained by `tokenizers`: "qwen" (Split on Qwen's regex + NFC) or "smollm"
    (Digits one by one, then ByteLevel's GPT-2 regex)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre
    tok = Tokenizer(models.BPE())
    if kind == "qwen":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre.Sequence([
            pre.Split(Regex(QWEN2_PAT_STR), behavior="isolated"),
            pre.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True),
                                          pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>",
                                                                        normalized=False)])
    tok.save(str(path))
    return tok


@pytest.mark.parametrize("kind", ["qwen", "smollm"])
def test_random_strings_encode_as_tokenizers_does(kind, tmp_path):
    theirs = train(kind, tmp_path / "tokenizer.json")
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    assert ours.vocab_size == theirs.get_vocab_size() and theirs.get_vocab_size() > 600
    rng = random.Random(1)
    alphabet = PIECES + list("abcXYZ019 \t\n'.é") + ["\u0301", "\u3000", "\u2028", "\x00"]
    strings = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
               for _ in range(1000)]
    differ = [s for s in strings if ours.encode(s) != theirs.encode(s).ids]
    # tiktoken takes a split piece that is a token whole; `tokenizers` without ignore_merges
    # merges it pair by pair and could spell it otherwise. Trained merges make no such case here.
    assert differ == [], f"{len(differ)} of 1000 differ, e.g. {differ[:3]!r}"
    agree_multi = sum(len(ours.encode(s)) < len(s.encode()) for s in strings)
    assert agree_multi > 500, "merges must really be exercised, or this checks little"
    assert ours.decode(ours.encode("naïve <think> 12")) == "naïve <think> 12"
    # the one difference by design: typed text that spells a special token stays text for us
    assert theirs.encode("<|im_end|>").ids == [ours.special["<|im_end|>"]]
    assert ours.special["<|im_end|>"] not in ours.encode("<|im_end|>")


def test_chatml_turns(tmp_path):
    train("qwen", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}}))
    tok = HFTokenizer(tmp_path / "tokenizer.json", n_rows=1300)
    start, end = tok.special["<|im_start|>"], tok.special["<|im_end|>"]
    assert (tok.eos_id, tok.eot_id, tok.pad_id, tok.stop_ids) == (end, end, 0, [end, 0])
    n_ids = 1 + max(tok.special.values())
    assert tok.vocab_size == 1300 and tok.mask_id == n_ids  # the first spare embedding row
    chat = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert chat == [start, *tok.encode("user\nHi"), end, *tok.encode("\n"), start,
                    *tok.encode("assistant\n")]
    assert tok.info == dict(kind="hf", path=str(tmp_path / "tokenizer.json"), n_rows=1300)


def test_refusals(tmp_path):
    train("qwen", tmp_path / "tokenizer.json")
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    cases = [({"model": {**spec["model"], "byte_fallback": True}}, "model.byte_fallback=True"),
             ({"normalizer": {"type": "NFKC"}}, "normalizer="),
             ({"pre_tokenizer": {"type": "Metaspace"}}, "pre_tokenizer"),
             ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}},
              "pre_tokenizer")]
    for change, phrase in cases:
        (tmp_path / "bad.json").write_text(json.dumps({**spec, **change}))
        with pytest.raises(ValueError, match=phrase):
            HFTokenizer(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="embedding rows"):
        HFTokenizer(tmp_path / "tokenizer.json", n_rows=10)
