"""
Tokenizers: Llama 3's byte-level BPE (through tiktoken, reading Meta's tokenizer.model) and a tiny
character-level tokenizer for the small synthetic tasks.

Llama 3's vocabulary is the n_base BPE ranks of tokenizer.model (128000 for the real file) followed by 256
special tokens with ids n_base + i (LLAMA.md). The SBD mask token is <|reserved_special_token_0|> (128002):
it has no role in Llama 3, so SBD can use it without resizing the vocabulary.

    tok = Llama3Tokenizer("Meta-Llama-3.1-8B-Instruct/original/tokenizer.model")
    ids = tok.encode_chat([{"role": "user", "content": "Hi!"}])  # ends with an open assistant header
"""

import base64
import os

import tiktoken

# Meta's split regex: contractions, words, 1-3 digit numbers, punctuation runs, newlines, other whitespace
PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_SPECIAL = 256
NAMED_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
# the rest are reserved, numbered on from 2: ids n_base+11 .. n_base+255 are reserved_2 .. reserved_246
SPECIAL_TOKENS = NAMED_SPECIAL + [f"<|reserved_special_token_{i}|>"
                                  for i in range(2, 2 + NUM_SPECIAL - len(NAMED_SPECIAL))]


def load_ranks(path):
    """tokenizer.model -> {token bytes: rank}; one "base64(token bytes) rank" per line."""
    ranks = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not parts[1].isdigit():
                raise ValueError(f"{path}:{line_no}: expected 'base64 rank', got {line[:80]!r}")
            ranks[base64.b64decode(parts[0])] = int(parts[1])
    if sorted(ranks.values()) != list(range(len(ranks))):  # special ids follow on from the last rank
        raise ValueError(f"{path}: ranks must be 0..{len(ranks) - 1} with no gaps or repeats")
    return ranks


class Llama3Tokenizer:
    def __init__(self, model_path):
        ranks = load_ranks(model_path)
        n_base = len(ranks)
        self.special = {name: n_base + i for i, name in enumerate(SPECIAL_TOKENS)}  # 128000 + i for the real file
        self.enc = tiktoken.Encoding(name=os.path.basename(model_path), pat_str=PAT_STR,
                                     mergeable_ranks=ranks, special_tokens=self.special)
        self.vocab_size = n_base + NUM_SPECIAL  # 128256
        self.bos_id = self.special["<|begin_of_text|>"]
        self.eos_id = self.special["<|end_of_text|>"]
        self.eot_id = self.special["<|eot_id|>"]
        self.stop_ids = [self.eos_id, self.special["<|eom_id|>"], self.eot_id]  # any of these ends generation
        self.mask_id = self.special["<|reserved_special_token_0|>"]  # the SBD mask token

    def encode(self, text, bos=False, eos=False):
        """Plain text -> ids. Text that looks like a special token ("<|eot_id|>" typed by a user) stays
        ordinary text: only the code below ever inserts special ids."""
        ids = self.enc.encode(text, allowed_special=set(), disallowed_special=())
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids])

    def encode_header(self, role):
        """<|start_header_id|>{role}<|end_header_id|>\\n\\n"""
        return [self.special["<|start_header_id|>"], *self.encode(role), self.special["<|end_header_id|>"],
                *self.encode("\n\n")]

    def encode_chat(self, messages):
        """[{"role": ..., "content": ...}, ...] -> ids in the Llama 3.1 chat format, as Meta's ChatFormat:

        <|begin_of_text|> then per message <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>,
        then an open <|start_header_id|>assistant<|end_header_id|>\\n\\n for the model to continue.
        Contents are stripped of surrounding whitespace; no default system prompt is added.
        """
        ids = [self.bos_id]
        for message in messages:
            ids += self.encode_header(message["role"]) + self.encode(message["content"].strip()) + [self.eot_id]
        return ids + self.encode_header("assistant")


class CharTokenizer:
    """One id per character, in the order given: CharTokenizer("0123456789+=") encodes "1+2" as [1, 10, 2]."""

    def __init__(self, chars):
        if len(set(chars)) != len(chars):
            raise ValueError(f"repeated characters in the vocabulary {chars!r}")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    def encode(self, text):
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)
