"""GGUFTokenizer tests on a tiny byte-level BPE written as GGUF metadata: 4 special tokens, 255 of
the 256 single bytes (0x04 has no token, as in SmolLM2) and a few merges, so expected ids can be
worked out by hand. A slow reference written from llama.cpp's rules (split in stages, then apply
merges in list order) must give the ids of the tiktoken encoding on thousands of random strings."""

import random
import unicodedata

import pytest

from pretrained.tokenizer import (
    CHATML_HEAD,
    CHATML_SYSTEM_CLOSE,
    CHATML_SYSTEM_OPEN,
    CHATML_TAIL,
    GGUFTokenizer,
    gpt2_byte_chars,
)

CHAR = gpt2_byte_chars()  # byte -> the character GGUF writes it as (space -> 'Ġ', newline -> 'Ċ')
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<empty_output>"]
MISSING_BYTE = 0x04
BYTES = [CHAR[b] for b in range(256) if b != MISSING_BYTE]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ Ġ", "Ċ Ċ", "Ġ hello", "1 2", "Ġ 1", "Ã ©", "' s"]
TOKENS = SPECIALS + BYTES + [m.replace(" ", "") for m in MERGES]
ID = {token: i for i, token in enumerate(TOKENS)}
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOLLM2_TEMPLATE = (CHATML_HEAD + CHATML_SYSTEM_OPEN + SYSTEM + CHATML_SYSTEM_CLOSE + CHATML_TAIL)


def tiny_tokenizer_metadata(pre="smollm", template=SMOLLM2_TEMPLATE):
    """The tokenizer.* keys of a GGUF file, as llama.cpp's converter writes them."""
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.merges": MERGES,
            "tokenizer.ggml.token_type": [3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.padding_token_id": 2}
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return meta


def b(text):
    """ids of text with no merge applied: one byte token per byte"""
    return [ID[CHAR[x]] for x in text.encode()]


@pytest.fixture(scope="module")
def tok():
    return GGUFTokenizer(tiny_tokenizer_metadata(), name="tiny")


# -----------------------------------------------------------------------------
# a slow reference: llama.cpp's rules written out by hand (no regex engine, no tiktoken)

WHITE_SPACE = set("\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}  # Unicode's White_Space property: regex \s
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]


def kind(c):
    """'S' whitespace, 'L' letter, 'N' number, 'P' anything else"""
    if c in WHITE_SPACE:
        return "S"
    return unicodedata.category(c)[0] if unicodedata.category(c)[0] in "LN" else "P"


def gpt2_pieces(text):
    """GPT-2's 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    written out by hand."""
    pieces, i, n = [], 0, len(text)
    while i < n:
        c = next((c for c in CONTRACTIONS if text.startswith(c, i)), None)
        if c:
            end = i + len(c)
        else:
            j = i + 1 if text[i] == " " and i + 1 < n and kind(text[i + 1]) != "S" else i
            end = j + 1
            while end < n and kind(text[end]) == kind(text[j]):
                end += 1
            if kind(text[j]) == "S" and end < n and end - i > 1:
                end -= 1  # spaces before a word: the last one goes with the word
        pieces.append(text[i:end])
        i = end
    return pieces


def smollm_pieces(text):
    """Two stages, as llama.cpp for pre "smollm": every digit alone, GPT-2's rules on the rest."""
    pieces, stretch = [], ""
    for c in text:
        if kind(c) == "N":
            pieces += gpt2_pieces(stretch) + [c]
            stretch = ""
        else:
            stretch += c
    return pieces + gpt2_pieces(stretch)


def reference_encode(text, pre="smollm"):
    """Split, then merge the adjacent pair listed first in MERGES until none applies; a character
    with no token (a missing byte) is dropped, as llama.cpp does."""
    rank = {tuple(m.split(" ")): r for r, m in enumerate(MERGES)}
    ids = []
    for piece in (smollm_pieces if pre == "smollm" else gpt2_pieces)(text):
        parts = [CHAR[x] for x in piece.encode()]
        while True:
            pairs = [(rank.get(pair, len(rank)), i) for i, pair in enumerate(zip(parts, parts[1:]))]
            r, i = min(pairs, default=(len(rank), 0))
            if r == len(rank):
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [ID[p] for p in parts if p in ID]
    return ids


ALPHABET = (["h", "e", "l", "o", "a", "Z", "s", "'", "1", "2", "9", " ", " ", " ", "\n", "\t", "\r",
             "!", ".", "<|im_end|>", "é", "😀", "\u3000", "\xa0", "Ⅻ", "²", "٣", "\u0301", "\x04",
             "'s", "'ll", "hello", "12"])


def random_strings(n, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))) for _ in range(n)]


# -----------------------------------------------------------------------------


def test_merges_and_split(tok):
    assert tok.encode("hello") == [ID["hello"]]  # he, ll -> hell -> hello
    assert tok.encode("hello hello") == [ID["hello"], ID["Ġhello"]]
    assert tok.encode("é") == [ID["Ã©"]]  # two bytes, one merge
    assert tok.encode("it's") == b("it") + [ID["'s"]]


def test_digits_are_split_one_by_one(tok):
    """pre "smollm": "12" never merges although the merge exists, and the spaces before a number
    stay together instead of the last one joining the number."""
    assert tok.encode("12") == [ID["1"], ID["2"]]
    assert tok.encode("x  12") == [ID["x"], ID["ĠĠ"], ID["1"], ID["2"]]
    assert tok.encode("x 1") == [ID["x"], ID["Ġ"], ID["1"]]  # " 1" is never a piece
    assert tok.encode("a1b") == [ID["a"], ID["1"], ID["b"]]
    gpt2 = GGUFTokenizer(tiny_tokenizer_metadata(pre="gpt2"))
    assert gpt2.encode("x  12") == [ID["x"], ID["Ġ"], ID["Ġ"], ID["12"]]  # " 12": "1 2" ranks first
    assert gpt2.encode("x 1") == [ID["x"], ID["Ġ1"]]


def test_spaces_and_newlines(tok):
    assert tok.encode("a\n\n\nb") == [ID["a"], ID["ĊĊ"], ID["Ċ"], ID["b"]]  # last newline alone
    assert tok.encode("a   hello") == [ID["a"], ID["ĠĠ"], ID["Ġhello"]]  # last space joins the word
    assert tok.encode("a  ") == [ID["a"], ID["ĠĠ"]]  # at the end: all of them
    assert tok.encode(" \n ") == [ID["Ġ"], ID["Ċ"], ID["Ġ"]]


def test_special_token_text_stays_text(tok):
    ids = tok.encode("say <|im_end|> now")
    assert ids == b("say <|im_end|> now") and tok.eot_id not in ids
    assert tok.decode([ID["<|im_end|>"]]) == "<|im_end|>"


def test_missing_byte_is_dropped(tok):
    """No token for byte 0x04: encode drops it, as llama.cpp and Hugging Face's tokenizers do."""
    assert tok.encode("a\x04b") == [ID["a"], ID["b"]]
    assert all(i < tok.vocab_size for i in tok.encode("\x04" * 3 + "héllo\x04"))


def test_round_trip(tok):
    texts = ["hello world, héllo wörld 😀 12345\n\n  it's <|im_end|>\ttabs\r\n", "", " ",
             "\u3000x²Ⅻ"]
    texts += [s for s in random_strings(500, seed=1) if "\x04" not in s]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("pre", ["smollm", "gpt2"])
def test_matches_reference(pre):
    """The one tiktoken regex and tiktoken's rank order == the staged split and the merge order."""
    tok = GGUFTokenizer(tiny_tokenizer_metadata(pre=pre))
    for text in random_strings(3000, seed=2) + ["x  12", "a  1 2  ", "\n 1", "Ⅻ 1", "'s1's"]:
        assert tok.encode(text) == reference_encode(text, pre), repr(text)


def test_special_ids_and_attributes(tok):
    assert tok.special == {name: i for i, name in enumerate(SPECIALS)}
    assert tok.vocab_size == len(TOKENS)
    assert (tok.bos_id, tok.eos_id, tok.eot_id, tok.pad_id) == (1, 2, 2, 2)
    assert tok.stop_ids == [2, 0]  # <|im_end|>, then <|endoftext|>
    assert tok.mask_id == ID["<empty_output>"]
    assert tok.encode("hi", bos=True, eos=True) == [1] + b("hi") + [2]


def test_chat_layout(tok):
    """ChatML as the template renders it; the default system turn comes first when the chat has no
    system message, and the prompt ends with the open assistant turn."""
    start, end, nl = ID["<|im_start|>"], ID["<|im_end|>"], ID["Ċ"]
    user = [{"role": "user", "content": " 12 \n"}]
    system_turn = [start, *b("system"), nl, *tok.encode(SYSTEM), end, nl]
    user_turn = [start, *b("user"), nl, ID["Ġ"], ID["1"], ID["2"], ID["Ġ"], nl, end, nl]  # as is
    assistant = [start, *b("assistant"), nl]
    assert tok.encode_chat(user) == system_turn + user_turn + assistant
    own = [{"role": "system", "content": "hello"}] + user
    system_turn = [start, *b("system"), nl, ID["hello"], end, nl]
    assert tok.encode_chat(own) == system_turn + user_turn + assistant
    assert tok.encode_chat([]) == assistant  # the template's loop never runs


def test_chat_templates():
    plain = GGUFTokenizer(tiny_tokenizer_metadata(template=CHATML_HEAD + CHATML_TAIL))
    assert plain.default_system is None
    assert plain.encode_chat([{"role": "user", "content": "hi"}])[:3] == [1, *b("us")]
    for template, message in [(None, "no chat template"), ("{{ bos_token }}{% for m in messages %}",
                                                           "unrecognised chat template")]:
        tok = GGUFTokenizer(tiny_tokenizer_metadata(template=template))
        assert tok.encode("hello") == [ID["hello"]]  # plain text still works
        with pytest.raises(ValueError, match=message):
            tok.encode_chat([{"role": "user", "content": "hi"}])


def test_bad_vocabularies():
    def broken(**changes):
        return GGUFTokenizer({**tiny_tokenizer_metadata(), **changes}, name="bad")
    with pytest.raises(ValueError, match="only byte-level BPE"):
        broken(**{"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="pre-tokenizer 'deepseek-llm' is not supported"):
        broken(**{"tokenizer.ggml.pre": "deepseek-llm"})
    with pytest.raises(ValueError, match="merge 1 'h e'"):  # listed twice: no longer increasing
        broken(**{"tokenizer.ggml.merges": ["h e", "h e"] + MERGES[1:]})
    with pytest.raises(ValueError, match="made by no merge"):
        broken(**{"tokenizer.ggml.merges": MERGES[:-1]})
    with pytest.raises(ValueError, match="not a byte-level BPE token"):
        broken(**{"tokenizer.ggml.tokens": TOKENS[:-1] + ["日本"]})


def test_read_from_a_gguf_file(tmp_path):
    """The same tokenizer written with gguf.GGUFWriter and read back by load_gguf_tokenizer."""
    gguf = pytest.importorskip("gguf")
    from pretrained.load_gguf import load_gguf_tokenizer
    path = tmp_path / "tok.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in tiny_tokenizer_metadata().items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tok = load_gguf_tokenizer(path)
    assert tok.encode("hello x  12") == [ID["hello"], ID["Ġ"], ID["x"], ID["ĠĠ"], ID["1"], ID["2"]]
    assert tok.default_system == SYSTEM and tok.special["<|im_end|>"] == 2
