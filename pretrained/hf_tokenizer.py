"""
A Hugging Face tokenizer.json (byte-level BPE: Qwen-3's, SmolLM2's, Llama 3's) as a tiktoken
Encoding, with the interface of tokenizer.Llama3Tokenizer and ChatML turns. The `tokenizers`
package is not needed: the file is JSON, and tokenizer.ByteLevelBPE does the encoding.

    tok = HFTokenizer("Qwen3-8B/tokenizer.json", n_rows=151936)  # n_rows: the embedding's rows
    ids = tok.encode_chat([{"role": "user", "content": "Hi!"}])  # ends with an open assistant turn

What is read, and what must hold (else a ConfigError names the key):
- model: "BPE" with a vocabulary in GPT-2's byte characters and merges in the order tiktoken's ranks
  need (tokenizer.byte_level_ranks); no byte fallback, dropout, word prefix or suffix.
- pre_tokenizer: a Split on one regex then ByteLevel without its own regex (Qwen, Llama 3), or
  ByteLevel with GPT-2's regex, after Digits one by one or not (SmolLM2); never a prefix space.
- normalizer: none, or NFC (Qwen).
- added_tokens: special ones are never produced by encode() (text that looks like one stays text);
  the others (Qwen-3's <think>, </think>, <tool_call>...) are found in text, as `tokenizers` does.
- tokenizer_config.json beside it, if there: eos_token, pad_token and bos_token.
The chat is ChatML (<|im_start|>{role}\\n{content}<|im_end|>\\n per turn, then the open
<|im_start|>assistant\\n), rendered in Python: the vocabulary must hold <|im_start|> and <|im_end|>.
Qwen-3's template adds no default system prompt; with enable_thinking=False it would also add an
empty <think>\\n\\n</think>\\n\\n to the open turn, which this does not.

Where tiktoken and `tokenizers` can differ: tiktoken takes a split piece that is a token whole, as
`tokenizers` does with ignore_merges (Llama 3) but not without (Qwen), where the merges might spell
the piece in other tokens; tests/test_hf_tokenizer.py counts such cases on random text.

SBD's mask (mask_id): <|reserved_special_token_0|> (Llama 3) or <empty_output> (SmolLM2) if the
vocabulary has one, else the first embedding row past the tokenizer's ids when the model has more
rows than ids (Qwen-3: 151669 ids, 151936 rows, mask 151669): a row no text ever produces.
"""

import json
import os

from configurator import ConfigError
from pretrained.tokenizer import (
    GPT2_PAT_STR,
    MASK_TOKEN,
    SMOLLM_PAT_STR,
    ByteLevelBPE,
    byte_level_ranks,
)

MASK_TOKENS = ["<|reserved_special_token_0|>", MASK_TOKEN]  # Llama 3's, SmolLM2's
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False}  # the keys that must hold these
DIGITS = {"type": "Digits", "individual_digits": True}


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def split_pattern(pre, path):
    """tokenizer.json's pre_tokenizer -> one tiktoken regex that splits text as it does."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    byte_level = steps[-1] if steps and isinstance(steps[-1], dict) else {}
    if byte_level.items() >= BYTE_LEVEL.items():
        split, use_regex = steps[:-1], byte_level.get("use_regex", True)
        if not use_regex and len(split) == 1 and is_isolated_split(split[0]):
            return split[0]["pattern"]["Regex"]  # Qwen, Llama 3: the regex, then bytes
        if use_regex and split == []:
            return GPT2_PAT_STR  # ByteLevel's own regex is GPT-2's
        if use_regex and len(split) == 1 and split[0].items() >= DIGITS.items():
            return SMOLLM_PAT_STR  # every digit alone, then GPT-2's regex between them
    raise ConfigError(f"{path}: pre_tokenizer {json.dumps(pre)[:300]} is not one this loader "
                      "can split as (a Split on a regex, or Digits, then ByteLevel without a "
                      "prefix space)")


def is_isolated_split(step):
    """A Split that keeps each regex match as a piece of its own, as tiktoken's pat_str does."""
    return (step.get("type") == "Split" and "Regex" in (step.get("pattern") or {})
            and step.get("behavior") == "Isolated" and not step.get("invert"))


def check_bpe_model(model, normalizer, path):
    """The BPE settings under which merging is plain byte-level BPE, as tiktoken does it."""
    plain = {"type": "BPE", "dropout": None, "byte_fallback": False,
             "continuing_subword_prefix": "", "end_of_word_suffix": ""}
    wrong = [f"model.{k}={model.get(k)!r} (need {v!r})" for k, v in plain.items()
             if model.get(k) != v and not (v == "" and model.get(k) is None)]
    if normalizer is not None and normalizer != {"type": "NFC"}:
        wrong.append(f"normalizer={json.dumps(normalizer)[:200]} (need null or NFC)")
    if wrong:
        raise ConfigError(f"{path}: unsupported tokenizer.json: {'; '.join(wrong)}")


def token_text(value):
    """tokenizer_config.json states a token as its text or as {"content": text, ...}."""
    return value.get("content") if isinstance(value, dict) else value


class HFTokenizer(ByteLevelBPE):
    """tokenizer.json -> a tiktoken Encoding (module docstring). n_rows: the model's embedding rows,
    at least the tokenizer's ids (vocab_size is n_rows, so train.py's check holds); None: as many
    rows as ids."""

    def __init__(self, path, n_rows=None):
        path = os.fspath(path)
        spec = read_json(path)
        model = spec.get("model") or {}
        check_bpe_model(model, spec.get("normalizer"), path)
        pat_str = split_pattern(spec.get("pre_tokenizer"), path)
        added = {t["content"]: t for t in spec.get("added_tokens", [])}
        special = {text: t["id"] for text, t in added.items()}
        vocab = {token: i for token, i in model.get("vocab", {}).items()
                 if special.get(token) != i}  # an added token listed in the vocabulary too
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        ranks = byte_level_ranks(vocab, merges, path)
        n_ids = max([*vocab.values(), *special.values()]) + 1
        if n_rows is not None and n_rows < n_ids:
            raise ConfigError(f"{path}: the tokenizer has ids up to {n_ids - 1}, the model only "
                              f"{n_rows} embedding rows")
        self.set_roles(special, os.path.join(os.path.dirname(path), "tokenizer_config.json"))
        named_masks = [special[t] for t in MASK_TOKENS if t in special]
        spare_row = n_ids if n_rows is not None and n_rows > n_ids else None
        self.mask_id = (named_masks or [spare_row])[0]
        self.default_system = None
        self.chat_problem = (None if "<|im_start|>" in special and "<|im_end|>" in special else
                             f"{path} has no <|im_start|> and <|im_end|>: only ChatML is rendered")
        text_tokens = [text for text, t in added.items() if not t.get("special")]
        self.build(os.path.basename(path), ranks, special, pat_str, n_rows or n_ids,
                   text_tokens, normalize="NFC" if spec.get("normalizer") else None)
        self.info = dict(kind="hf", path=os.path.abspath(path), n_rows=n_rows)

    def set_roles(self, special, config_path):
        """bos_id, eos_id, pad_id from tokenizer_config.json if there; a missing end of text is
        <|endoftext|>, a missing pad the end of text (padding is never a label)."""
        config = read_json(config_path) if os.path.exists(config_path) else {}
        ids = {}
        for role in ("bos_token", "eos_token", "pad_token"):
            text = token_text(config.get(role))
            if text is not None and text not in special:
                raise ConfigError(f"{config_path}: {role} {text!r} is not an added token of "
                                  "tokenizer.json")
            ids[role] = special.get(text)
        self.bos_id = ids["bos_token"]
        self.eos_id = ids["eos_token"] if ids["eos_token"] is not None else special.get(
            "<|endoftext|>")
        self.pad_id = ids["pad_token"] if ids["pad_token"] is not None else self.eos_id
