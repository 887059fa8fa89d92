"""Tokenizer tests on a tiny rank file written here: the 256 single bytes (rank = byte value) plus a
few merges, so every expected id below can be worked out by hand."""

import base64

import pytest

from pretrained.tokenizer import CharTokenizer, Llama3Tokenizer

MERGES = [b"o ", b"\n\n", b"he", b"ll", b"hell", b"hello", b"12", b"123", b"45", b"us", b"er",
          b"user"]
ID = {token: 256 + i for i, token in enumerate(MERGES)}  # merged tokens' ids, in rank order
N_BASE = 256 + len(MERGES)  # 268: the special tokens start here (128000 in the real file)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    tokens = [bytes([b]) for b in range(256)] + MERGES
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n"
                            for rank, t in enumerate(tokens)))
    return Llama3Tokenizer(str(path))


def test_bpe_merges_and_split_regex(tok):
    assert tok.encode("hello") == [ID[b"hello"]]  # he, ll -> hell -> hello
    assert tok.encode("user") == [ID[b"user"]]  # us (lower rank) first, then er, then user
    # the regex splits "hello world" into "hello" and " world": top-rank merge "o " never applies
    assert tok.encode("hello world") == [ID[b"hello"]] + list(b" world")
    assert tok.encode("12345") == [ID[b"123"], ID[b"45"]]  # numbers split into runs of <= 3 digits
    assert tok.encode("a\n\nb") == [ord("a"), ID[b"\n\n"], ord("b")]
    assert tok.encode("hi", bos=True, eos=True) == [N_BASE, ord("h"), ord("i"), N_BASE + 1]


def test_round_trip(tok):
    text = "hello world, héllo wörld 😀 12345\n\n  it's <|eot_id|>\ttabs\r\n"
    assert tok.decode(tok.encode(text)) == text


def test_special_token_ids(tok):
    expected = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 2: "<|reserved_special_token_0|>",
                3: "<|reserved_special_token_1|>", 4: "<|finetune_right_pad_id|>", 5: "<|step_id|>",
                6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>",
                10: "<|python_tag|>", 11: "<|reserved_special_token_2|>",
                12: "<|reserved_special_token_3|>", 255: "<|reserved_special_token_246|>"}
    for i, name in expected.items():
        assert tok.special[name] == N_BASE + i
        assert tok.decode([N_BASE + i]) == name
    assert len(tok.special) == 256 and tok.vocab_size == N_BASE + 256
    assert tok.stop_ids == [N_BASE + 1, N_BASE + 8, N_BASE + 9]
    assert tok.mask_id == N_BASE + 2


def test_special_token_text_stays_text(tok):
    ids = tok.encode("say <|eot_id|> now")
    assert ids == list(b"say <|eot_id|> now")  # no merge applies, so one id per byte
    assert tok.eot_id not in ids


def test_chat_format_layout(tok):
    messages = [{"role": "system", "content": "hello"}, {"role": "user", "content": " 12 \n"}]
    start, end, eot = N_BASE + 6, N_BASE + 7, N_BASE + 9
    expected = ([N_BASE]
                + [start, *b"system", end, ID[b"\n\n"], ID[b"hello"], eot]
                + [start, ID[b"user"], end, ID[b"\n\n"], ID[b"12"], eot]  # content stripped
                + [start, *b"assistant", end, ID[b"\n\n"]])  # open assistant header
    assert tok.encode_chat(messages) == expected


def test_bad_rank_file(tmp_path):
    path = tmp_path / "bad.model"
    path.write_text("YQ== 0\nYg== 2\n")  # ranks 0 and 2: a gap
    with pytest.raises(ValueError, match="bad.model"):
        Llama3Tokenizer(str(path))
    path.write_text("YQ==\n")
    with pytest.raises(ValueError, match="bad.model:1"):
        Llama3Tokenizer(str(path))


def test_char_tokenizer():
    tok = CharTokenizer("0123456789+=")
    assert tok.encode("1+2=3") == [1, 10, 2, 11, 3]
    assert tok.decode([1, 10, 2, 11, 3]) == "1+2=3" and tok.vocab_size == 12
    with pytest.raises(ValueError):
        CharTokenizer("abca")
