"""
Tokenizers: Llama 3's byte-level BPE (through tiktoken, reading Meta's tokenizer.model), the
byte-level BPE stored in a GGUF file's metadata (SmolLM2's, through tiktoken too), and a tiny
character-level tokenizer for the small synthetic tasks.

Llama 3's vocabulary is the n_base BPE ranks of tokenizer.model (128000 for the real file) followed
by 256 special tokens with ids n_base + i. The SBD mask token is <|reserved_special_token_0|>
(128002): it has no role in Llama 3, so SBD can use it without resizing the vocabulary.

    tok = Llama3Tokenizer("Meta-Llama-3.1-8B-Instruct/original/tokenizer.model")
    ids = tok.encode_chat([{"role": "user", "content": "Hi!"}])  # ends with an open assistant turn

A GGUF file's tokenizer comes with its weights: load_gguf.load_gguf(path) returns it as
info["tokenizer"] (a GGUFTokenizer, same interface); load_gguf.load_gguf_tokenizer(path) reads it
alone.
"""

import base64
import os
import unicodedata

import tiktoken

from configurator import ConfigError

# Meta's split regex: contractions, words, 1-3 digit numbers, punctuation runs, newlines, spaces
PAT_STR = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_SPECIAL = 256
NAMED_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>"]
# the rest are reserved, numbered on from 2: ids n_base+11 .. n_base+255 are reserved_2 .. _246
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
                raise ConfigError(f"{path}:{line_no}: expected 'base64 rank', got {line[:80]!r}")
            ranks[base64.b64decode(parts[0])] = int(parts[1])
    if sorted(ranks.values()) != list(range(len(ranks))):  # special ids follow the last rank
        raise ConfigError(f"{path}: ranks must be 0..{len(ranks) - 1} with no gaps or repeats")
    return ranks


class Llama3Tokenizer:
    def __init__(self, model_path):
        ranks = load_ranks(model_path)
        n_base = len(ranks)
        # 128000 + i for the real file
        self.special = {name: n_base + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.enc = tiktoken.Encoding(name=os.path.basename(model_path), pat_str=PAT_STR,
                                     mergeable_ranks=ranks, special_tokens=self.special)
        self.vocab_size = n_base + NUM_SPECIAL  # 128256
        self.bos_id = self.special["<|begin_of_text|>"]
        self.eos_id = self.special["<|end_of_text|>"]
        self.eot_id = self.special["<|eot_id|>"]
        # any of these ends generation
        self.stop_ids = [self.eos_id, self.special["<|eom_id|>"], self.eot_id]
        self.mask_id = self.special["<|reserved_special_token_0|>"]  # the SBD mask token
        self.pad_id = self.special["<|finetune_right_pad_id|>"]  # never produced by encoding text
        self.info = dict(kind="llama", path=os.path.abspath(model_path))  # what a checkpoint keeps

    def encode(self, text, bos=False, eos=False):
        """Plain text -> ids. Text that looks like a special token ("<|eot_id|>" typed by a user)
        stays ordinary text: only the code below ever inserts special ids."""
        ids = self.enc.encode(text, allowed_special=set(), disallowed_special=())
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids])

    def encode_header(self, role):
        """<|start_header_id|>{role}<|end_header_id|>\\n\\n"""
        return [self.special["<|start_header_id|>"], *self.encode(role),
                self.special["<|end_header_id|>"], *self.encode("\n\n")]

    def encode_chat(self, messages):
        """[{"role": ..., "content": ...}, ...] -> ids in Llama 3.1's chat format, as Meta's
        ChatFormat: <|begin_of_text|> then per message
        <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>,
        then an open <|start_header_id|>assistant<|end_header_id|>\\n\\n for the model to continue.
        Contents are stripped of surrounding whitespace; no default system prompt is added.
        """
        ids = [self.bos_id]
        for message in messages:
            content = self.encode(message["content"].strip())
            ids += self.encode_header(message["role"]) + content + [self.eot_id]
        return ids + self.encode_header("assistant")


# -----------------------------------------------------------------------------
# byte-level BPE from a GGUF file's metadata (llama.cpp's format), e.g. SmolLM2-135M-Instruct

# GGUF token types (gguf.TokenType): NORMAL tokens are BPE tokens, the others special tokens
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 2, 3, 4, 5
SPECIAL_TYPES = {TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED}

# llama.cpp's pre-tokenizers (tokenizer.ggml.pre), each written as one tiktoken regex.
# "gpt2": GPT-2's regex.
GPT2_PAT_STR = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# "smollm": llama.cpp splits in two stages: every number character (\p{N}) becomes a piece of its
# own, then GPT-2's regex splits each stretch between them on its own (SmolLM2's tokenizer.json:
# Digits with individual_digits, then ByteLevel). One regex does the same if only a lone \p{N} can
# take a number character, and whitespace just before one is taken whole, as the end of a stretch:
# GPT-2's \s+(?!\S) becomes \s+(?![^\s\p{N}]). "x  12" -> "x", "  ", "1", "2" (GPT-2's regex:
# "x", " ", " 12").
SMOLLM_PAT_STR = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"
# "qwen2" (Qwen2's to Qwen-3's tokenizer.json; llama.cpp spells the case-insensitive contractions
# out by hand): Llama 3's regex, but every number character is a piece of its own
QWEN2_PAT_STR = PAT_STR.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = {"gpt2": GPT2_PAT_STR, "smollm": SMOLLM_PAT_STR, "qwen2": QWEN2_PAT_STR}

# The chat templates GGUFTokenizer renders (in Python, no jinja): ChatML as SmolLM2's file states
# it, with or without the block that adds a default system prompt to a chat with no system message.
CHATML_HEAD = "{% for message in messages %}"
CHATML_SYSTEM_OPEN = ("{% if loop.first and messages[0]['role'] != 'system' %}"
                      "{{ '<|im_start|>system\n")
CHATML_SYSTEM_CLOSE = "<|im_end|>\n' }}{% endif %}"
CHATML_TAIL = ("{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
               " + '\n'}}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

MASK_TOKEN = "<empty_output>"  # SBD's mask token in SmolLM2 (GGUFTokenizer says why)


def gpt2_byte_chars():
    """GPT-2's table {byte: character} in which byte-level BPE tokens are written: the 188
    printable bytes stand for themselves, the other 68 become chr(256 + i) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, n_moved = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n_moved)  # space -> 'Ġ', newline -> 'Ċ'
            n_moved += 1
    return table


def parse_chatml(template):
    """tokenizer.chat_template -> (default system prompt or None, None), or (None, why not) when
    it is not one of the ChatML templates above."""
    if template is None:
        return None, "the file has no chat template (tokenizer.chat_template): a base model"
    if template.startswith(CHATML_HEAD) and template.endswith(CHATML_TAIL):
        middle = template[len(CHATML_HEAD):-len(CHATML_TAIL)]
        if middle == "":
            return None, None
        system = middle[len(CHATML_SYSTEM_OPEN):-len(CHATML_SYSTEM_CLOSE)]
        plain = not any(c in system for c in "'\\{}")  # a quote or escape would change the literal
        if middle == CHATML_SYSTEM_OPEN + system + CHATML_SYSTEM_CLOSE and plain:
            return system, None
    return None, f"unrecognised chat template (only ChatML is rendered): {template[:200]!r}"


class ByteLevelBPE:
    """A byte-level BPE vocabulary as a tiktoken Encoding, with the interface of Llama3Tokenizer and
    ChatML turns: what GGUFTokenizer and hf_tokenizer.HFTokenizer share. A subclass reads its file,
    then calls build(); it sets bos_id, eos_id, pad_id, mask_id, default_system and chat_problem.

    - Special tokens: decode() writes their text, encode() never produces them (text that looks
      like one stays text), except text_tokens, which encode() finds in text as HF's tokenizers
      finds its added tokens that are not special (Qwen-3's <think>).
    - A byte with no token of its own (SmolLM2 lacks 21, e.g. 0x04) is dropped by encode(), as
      llama.cpp does (after merging, so it still separates its neighbours): no round trip there.
    - normalize: a Unicode form text is put in before splitting ("NFC" for Qwen), or None.
    """

    def build(self, name, ranks, special, pat_str, vocab_size, text_tokens=(), normalize=None):
        self.vocab_size, self.special, self.normalize = vocab_size, special, normalize
        self.text_tokens = set(text_tokens)
        self.bytes_without_token = [b for b in range(256) if bytes([b]) not in ranks]
        for b in self.bytes_without_token:  # tiktoken needs all 256: ids past the vocabulary,
            ranks[bytes([b])] = vocab_size + b  # which encode() drops
        self.enc = tiktoken.Encoding(name=name, pat_str=pat_str, mergeable_ranks=ranks,
                                     special_tokens=special)
        self.im_start = special.get("<|im_start|>")
        self.eot_id = special.get("<|im_end|>", self.eos_id)  # ends a turn (ChatML)
        stops = [self.eos_id, self.eot_id, special.get("<|endoftext|>")]
        self.stop_ids = list(dict.fromkeys(i for i in stops if i is not None))  # in order, once
        if self.chat_problem is None and self.im_start is None:
            self.chat_problem = "a ChatML template, but no <|im_start|> token"

    def encode(self, text, bos=False, eos=False):
        """Plain text -> ids. Text that looks like a special token ("<|im_end|>" typed by a user)
        stays ordinary text: only encode_chat inserts special ids."""
        if self.normalize:
            text = unicodedata.normalize(self.normalize, text)
        ids = self.enc.encode(text, allowed_special=self.text_tokens, disallowed_special=())
        ids = [i for i in ids if i < self.vocab_size]  # drop bytes that have no token
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids])

    def encode_turn(self, role, content):
        """<|im_start|>{role}\\n{content}<|im_end|>\\n. Tokenizing the rendered template with
        special tokens parsed cuts it at those first, so each stretch of text is encoded alone."""
        return [self.im_start, *self.encode(f"{role}\n{content}"), self.eot_id, *self.encode("\n")]

    def encode_chat(self, messages):
        """[{"role": ..., "content": ...}, ...] -> ids of the ChatML template, ending with the open
        assistant turn <|im_start|>assistant\\n. As the template: contents are not stripped, and
        its default system prompt (if any) comes first when the first message is not a system
        one."""
        if self.chat_problem:
            raise ConfigError(f"cannot render a chat: {self.chat_problem}")
        ids = []
        if self.default_system is not None and messages and messages[0]["role"] != "system":
            ids += self.encode_turn("system", self.default_system)
        for message in messages:
            ids += self.encode_turn(message["role"], message["content"])
        return ids + [self.im_start, *self.encode("assistant\n")]


class GGUFTokenizer(ByteLevelBPE):
    """A byte-level BPE vocabulary from GGUF metadata (tokenizer.ggml.model = "gpt2") as a tiktoken
    Encoding (ByteLevelBPE). metadata: {GGUF key: value}, as load_gguf.read_metadata returns it;
    only the tokenizer.* keys are read.

    - Ids are the file's: a NORMAL token's id is its tiktoken rank. tiktoken joins the adjacent
      pair whose concatenation has the lowest rank, llama.cpp the pair listed first in
      tokenizer.ggml.merges. The orders are the same when each merge makes a token with a larger id
      than the merge before it and every multi-byte token is made by one merge (checked; true for
      SmolLM2). tiktoken could still join a pair that spells a token without being its merge:
      tests/test_gguf_tokenizer.py and checks/smollm2_vs_transformers.py found no such case.
    - The split regex is llama.cpp's for the file's pre-tokenizer (PRE_TOKENIZERS).
    - Other token types (CONTROL, USER_DEFINED, ...) are special tokens.
    - mask_id (SBD) is <empty_output> (16) when the file has it, else the first UNUSED token (the
      converter's [PAD151669] for Qwen-3's embedding rows past its tokens), else None. SmolLM2's
      ids 5 and 7-16 share one embedding row (to Q8_0 rounding): they never occurred in training,
      and a chat never uses them. Reusing one keeps the vocabulary and the tied head as they are.
    """

    def __init__(self, metadata, name="gguf"):
        model, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre")
        if model != "gpt2":
            raise ConfigError(f"{name}: tokenizer.ggml.model is {model!r}; only byte-level BPE "
                             "('gpt2') is supported")
        if pre not in PRE_TOKENIZERS:
            raise ConfigError(f"{name}: pre-tokenizer {pre!r} is not supported (known: "
                             f"{sorted(PRE_TOKENIZERS)})")
        tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
        if len(types) != len(tokens):
            raise ConfigError(f"{name}: {len(tokens)} tokens but {len(types)} token types")
        ranks, special = bpe_ranks(tokens, types, metadata["tokenizer.ggml.merges"], name)
        self.bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        self.pad_id = metadata.get("tokenizer.ggml.padding_token_id")
        unused = [i for i, kind in enumerate(types) if kind == TOKEN_UNUSED]
        self.mask_id = special.get(MASK_TOKEN, unused[0] if unused else None)
        template = metadata.get("tokenizer.chat_template")
        self.default_system, self.chat_problem = parse_chatml(template)
        # Qwen's tokenizer.json puts text in Unicode's NFC before splitting: the model saw that
        self.build(name, ranks, special, PRE_TOKENIZERS[pre], len(tokens),
                   normalize="NFC" if pre == "qwen2" else None)


def bpe_ranks(tokens, types, merges, name):
    """GGUF token strings, types and merges -> ({token bytes: id} of the NORMAL tokens, {text: id}
    of the special ones), after checking that tiktoken's rank order is the merge order."""
    normal, special = {}, {}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind in SPECIAL_TYPES:
            special[token] = i
        elif kind != TOKEN_NORMAL:
            raise ConfigError(f"{name}: token {i} {token!r} (type {kind}) is not a byte-level BPE "
                             "token")
        elif normal.setdefault(token, i) != i:
            raise ConfigError(f"{name}: token {i} {token!r} appears twice in the vocabulary")
    return byte_level_ranks(normal, merges, name), special


def byte_level_ranks(vocab, merges, name):
    """{token in GPT-2's byte characters: id} and merges ("a b") -> {token bytes: id}, after
    checking that tiktoken's rank order is the merge order (GGUFTokenizer says why)."""
    byte_of = {c: b for b, c in gpt2_byte_chars().items()}
    ranks = {}
    for token, i in vocab.items():
        if not token or any(c not in byte_of for c in token):
            raise ConfigError(f"{name}: token {i} {token!r} is not a byte-level BPE token")
        ranks[bytes(byte_of[c] for c in token)] = i  # one string per byte sequence: no clash
    made, last = set(), -1  # ids of the tokens merges make; the id the last merge made
    for line, merge in enumerate(merges):
        parts = merge.split(" ")
        i = vocab.get("".join(parts), -1)
        if len(parts) != 2 or i <= last:
            raise ConfigError(f"{name}: merge {line} {merge!r} does not make a new token with a "
                             "larger id than the merge before it; tiktoken's ranks need that order")
        made.add(i)
        last = i
    unmade = [t for t, i in ranks.items() if len(t) > 1 and i not in made]
    if unmade:
        raise ConfigError(f"{name}: {len(unmade)} tokens longer than a byte are made by no merge, "
                         f"e.g. {unmade[0]!r}; tiktoken would produce them, llama.cpp would not")
    return ranks


class CharTokenizer:
    """One id per character, in the order given: CharTokenizer("0123456789+=") encodes "1+2" as
    [1, 10, 2]."""

    def __init__(self, chars):
        if len(set(chars)) != len(chars):
            raise ConfigError(f"repeated characters in the vocabulary {chars!r}")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)
        self.info = dict(kind="char", chars=chars)

    def encode(self, text):
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ConfigError(f"characters outside the vocabulary: {unknown}")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)
