"""The GGUF-vocabulary tokenizer and the exact-bytes detokenizer (aotx_trio.native.tokenizer).

Reference ids on the real Gemma 3 vocabulary were recorded once from llama.cpp
(llama-cpp-python 0.3.36, ``Llama(model_path, vocab_only=True).tokenize(text,
add_bos=True, special=...)``) and agree with SentencePiece 0.2.3 run on a
model proto built from the same GGUF arrays; neither is a test dependency.
"""

from __future__ import annotations

import pytest
from _real import real_gguf
from hypothesis import given, settings
from hypothesis import strategies as st

from aotx_trio import errors
from aotx_trio.native.lib import ffi, lib
from aotx_trio.native.tokenizer import BYTE, CONTROL, NORMAL, USER_DEFINED, Detokenizer, Tokenizer

MODEL = real_gguf()
MARK = "\u2581"  # the SentencePiece space marker


@pytest.fixture(scope="module")
def gemma() -> Tokenizer:
    import gguf

    return Tokenizer.from_gguf_fields(gguf.GGUFReader(str(MODEL)))


# (text, parse_special, ids with BOS) from llama.cpp on gemma-3-270m-q4_k_m.gguf
TURN = "<start_of_turn>user\nHi<end_of_turn>"
TURN_AS_TEXT = [2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 10979,
                236820, 643, 236779, 1340, 236779, 887, 236813]
KNOWN: list[tuple[str, bool, list[int]]] = [
    ("Hello world", False, [2, 9259, 1902]),
    ("The quick brown fox jumps over the lazy dog.", False,
     [2, 818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761]),
    (" leading space", False, [2, 5830, 2557]),
    ("trailing space ", False, [2, 136697, 2557, 236743]),
    ("  two leading and   three inner and trailing two  ", False,
     [2, 138, 13498, 5830, 532, 139, 19891, 9628, 532, 45330, 1156, 138]),
    (" ", False, [2, 236743]),
    ("line one\nline two\n\nparagraph\n", False, [2, 1257, 886, 107, 1257, 1156, 108, 35781, 107]),
    ("\n\n", False, [2, 108]),
    ("Numbers: 0 12 345 6789 3.14159 1,000,000", False,
     [2, 37091, 236787, 236743, 236771, 236743, 236770, 236778, 236743, 236800, 236812, 236810,
      236743, 236825, 236832, 236828, 236819, 236743, 236800, 236761, 236770, 236812, 236770,
      236810, 236819, 236743, 236770, 236764, 236771, 236771, 236771, 236764, 236771, 236771,
      236771]),
    ("Punctuation!? (yes) [no] {maybe}; a-b_c/d\\e 'q' \"dq\" #@$%^&*", False,
     [2, 236791, 23733, 3145, 64899, 568, 4443, 236768, 870, 1904, 236842, 642, 60766, 3796, 496,
      236772, 236763, 236779, 236755, 236786, 236753, 236785, 236744, 756, 236809, 236789, 623,
      120062, 236775, 997, 236940, 142788, 236884, 202079]),
    ("Accented: café naïve résumé Ångström façade Überprüfung", False,
     [2, 5475, 16764, 236787, 33443, 120362, 118515, 44667, 829, 80406, 96008, 30668, 123830]),
    ("CJK: 日本語のテキスト 中文文本 한국어", False,
     [2, 44248, 236787, 33375, 238582, 236945, 95830, 17346, 237364, 57489, 50413, 237430]),
    ("Emoji: 🦙🎉 👍🏽 ❤️", False,
     [2, 127268, 236787, 236743, 478, 397, 404, 391, 242061, 103712, 242713, 64813]),
    ("Rare CJK: 𪚥𠀀", False,
     [2, 128280, 565, 29351, 236787, 236743, 478, 408, 392, 403, 478, 398, 366, 366]),
    (TURN, False, TURN_AS_TEXT),
    (TURN, True, [2, 105, 2364, 107, 10979, 106]),
    (TURN + "\n<start_of_turn>model\n", True, [2, 105, 2364, 107, 10979, 106, 107, 105, 4368, 107]),
    ("Tabs\tand\t\tmore\ttabs", False, [2, 76222, 255968, 624, 255969, 5576, 255968, 39218]),
    ("<b>bold</b> <table>", False, [2, 200, 15640, 209, 236743, 168]),
    ("", False, [2]),
]


@pytest.mark.parametrize(("text", "special", "ids"), KNOWN)
def test_known_ids_on_the_gemma_vocabulary(gemma: Tokenizer, text: str, special: bool,
                                           ids: list[int]) -> None:
    assert gemma.encode(text, parse_special=special) == ids
    assert gemma.encode(text.encode(), add_bos=False, parse_special=special) == ids[1:]
    if not special:
        assert gemma.decode(ids) == text.encode()


def test_gemma_vocabulary_facts(gemma: Tokenizer) -> None:
    assert gemma.n_vocab == 262144
    assert (gemma.bos_id, gemma.eos_id, gemma.unk_id, gemma.pad_id) == (2, 1, 3, 0)
    assert gemma.add_bos and not gemma.add_space_prefix
    assert gemma.model == "llama" and gemma.pre is None   # SentencePiece mode, no pre-tokenizer
    assert gemma.piece(1902) == MARK.encode() + b"world"
    assert gemma.token_bytes(1902) == b" world"
    assert gemma.token_bytes(236743) == b" "
    assert (gemma.piece(248), gemma.token_bytes(248), gemma.token_type(248)) == (
        b"<0x0A>", b"\n", BYTE)
    # control tokens decode to nothing; user-defined ones to their text
    assert gemma.token_type(105) == CONTROL and gemma.token_bytes(105) == b""
    assert gemma.token_type(138) == USER_DEFINED and gemma.token_bytes(138) == b"  "
    assert gemma.decode([2, 105, 2364, 107, 10979, 106, 1]) == b"user\nHi"
    assert gemma.encode("Hello world", add_bos=True) == gemma.encode("Hello world")


def test_control_text_never_becomes_a_control_token_without_parse_special(
        gemma: Tokenizer) -> None:
    for text in ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad><mask>"):
        ids = gemma.encode(text, add_bos=False)
        assert all(gemma.token_type(i) != CONTROL for i in ids), (text, ids)
        assert gemma.decode(ids) == text.encode()
    assert gemma.encode("<bos><eos>", add_bos=False, parse_special=True) == [2, 1]


def test_long_prompt_matches_its_pieces(gemma: Tokenizer) -> None:
    # Words separated by a newline are tokenized independently of each other.
    para = "The quick brown fox jumps over the lazy dog."
    ids = gemma.encode("\n".join([para] * 50), add_bos=False)
    one = gemma.encode(para, add_bos=False)
    assert ids == ([*one, 107] * 50)[:-1]


# -- round trips ----------------------------------------------------------------------

# U+2581 in the input reads back as a space (it is the space marker), so it is excluded.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters=MARK), max_size=60)


@settings(max_examples=150, deadline=None)
@given(TEXT)
def test_roundtrip_text(gemma: Tokenizer, text: str) -> None:
    ids = gemma.encode(text, add_bos=False)
    assert gemma.decode(ids) == text.encode()
    assert all(gemma.token_type(i) != CONTROL for i in ids)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40).filter(lambda b: MARK.encode() not in b))
def test_roundtrip_any_bytes(gemma: Tokenizer, data: bytes) -> None:
    """Invalid UTF-8 goes to byte tokens and comes back exactly."""
    assert gemma.decode(gemma.encode(data, add_bos=False)) == data


# -- the incremental detokenizer ------------------------------------------------------

def _stream(d: Detokenizer, ids: list[int]) -> list[bytes]:
    return [d.push(i) for i in ids]


def test_detokenizer_holds_split_characters_until_complete(gemma: Tokenizer) -> None:
    text = "Rare CJK: 𪚥𠀀"
    ids = gemma.encode(text, add_bos=False)
    assert ids[-8:] == [478, 408, 392, 403, 478, 398, 366, 366]   # 8 byte tokens
    d = gemma.detokenizer()
    outs = _stream(d, ids)
    assert outs[-8:] == [b"", b"", b"", "𪚥".encode(), b"", b"", b"", "𠀀".encode()]
    for chunk in outs:
        chunk.decode("utf-8")          # every output is whole UTF-8
    assert b"".join(outs) + d.flush() == text.encode()
    assert d.flush() == b""


def test_detokenizer_emoji_via_bytes(gemma: Tokenizer) -> None:
    ids = gemma.encode("🦙!", add_bos=False)
    assert [gemma.token_type(i) for i in ids[:4]] == [BYTE] * 4
    d = gemma.detokenizer()
    assert _stream(d, ids) == [b"", b"", b"", "🦙".encode(), b"!"]


def test_detokenizer_invalid_bytes(gemma: Tokenizer) -> None:
    byte = {b: gemma.encode(bytes([b]), add_bos=False)[0] for b in (0xF0, 0x9F, 0xA6, 0xFF)}
    d = gemma.detokenizer()
    # a truncated character at the end of the stream comes out at flush, as is
    assert _stream(d, [byte[0xF0], byte[0x9F], byte[0xA6]]) == [b"", b"", b""]
    assert d.flush() == b"\xf0\x9f\xa6"
    # a byte that can never be valid passes through at once
    assert _stream(d, [byte[0xFF]]) == [b"\xff"]
    # a broken sequence is released as soon as it is known to be broken
    hello = gemma.encode("Hello", add_bos=False)
    assert _stream(d, [byte[0xF0], *hello]) == [b"", b"\xf0Hello"]
    assert _stream(d, [byte[0xF0], byte[0xF0]]) == [b"", b"\xf0"]
    assert d.flush() == b"\xf0"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(238, 493), st.integers(0, 262143)), max_size=30))
def test_detokenizer_is_exact_for_any_token_stream(gemma: Tokenizer, ids: list[int]) -> None:
    d = gemma.detokenizer()
    outs = _stream(d, ids)
    tail = d.flush()
    expected = b"".join(gemma.token_bytes(i) for i in ids)
    assert b"".join(outs) + tail == expected
    try:
        expected.decode("utf-8")
    except UnicodeDecodeError:
        return
    for chunk in outs:
        chunk.decode("utf-8")
    assert tail == b""


def test_detokenizer_rejects_bad_ids_and_keeps_state(gemma: Tokenizer) -> None:
    d = gemma.detokenizer()
    assert d.push(478) == b""
    with pytest.raises(errors.InvalidInput):
        d.push(262144)
    with pytest.raises(errors.InvalidInput):
        d.push(-1)
    assert b"".join(_stream(d, [397, 404, 391])) == "🦙".encode()


def test_native_buffer_conventions(gemma: Tokenizer) -> None:
    text = b"Hello world"
    out = ffi.new("int32_t[]", 8)
    assert lib.aotx_tokenize(gemma.handle, text, len(text), 1, 0, out, 2) == -3
    assert list(out)[:3] == [0, 0, 0]                    # nothing written
    assert lib.aotx_tokenize(gemma.handle, text, len(text), 1, 0, out, 8) == 3
    assert list(out)[:3] == [2, 9259, 1902]
    buf = ffi.new("uint8_t[]", 16)
    assert lib.aotx_token_bytes(gemma.handle, 1902, buf, 3) == -6
    assert lib.aotx_token_bytes(gemma.handle, 1902, buf, 16) == 6
    assert bytes(buf[0:6]) == b" world"
    d = ffi.new("aotx_detok *")
    lib.aotx_detok_init(d)
    assert lib.aotx_detok_push(gemma.handle, d, 1902, buf, 2) == -6
    assert d.n_held == 0 and d.started == 0              # unchanged by the refusal
    assert lib.aotx_detok_push(gemma.handle, d, 1902, buf, 16) == 6


def test_from_handle_borrows(gemma: Tokenizer) -> None:
    view = Tokenizer.from_handle(gemma.handle, gemma)
    assert view.n_vocab == gemma.n_vocab
    assert view.encode(TURN, parse_special=True) == [2, 105, 2364, 107, 10979, 106]


# -- a hand-made vocabulary that pins the algorithm -----------------------------------

def _bytes_tokens() -> list[tuple[str, float, int]]:
    return [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]


def _tiny(extra: list[tuple[str, float, int]], **kw: object) -> Tokenizer:
    base = [("<unk>", 0.0, CONTROL), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL)]
    vocab = base + _bytes_tokens() + extra
    return Tokenizer.from_vocab([t for t, _, _ in vocab], [s for _, s, _ in vocab],
                                [ty for _, _, ty in vocab], bos_id=1, eos_id=2, unk_id=0,
                                **kw)  # type: ignore[arg-type]


def _pieces(tok: Tokenizer, text: str, **kw: bool) -> list[str]:
    return [tok.piece(i).decode() for i in tok.encode(text, add_bos=False, **kw)]


def test_merge_order_highest_score_first() -> None:
    chars = [(c, -10.0, NORMAL) for c in "abcd"]
    # "bc" scores highest, so it merges first although "ab" is to its left
    tok = _tiny([*chars, ("ab", -2.0, NORMAL), ("bc", -1.0, NORMAL), ("cd", -3.0, NORMAL)])
    assert _pieces(tok, "abcd") == ["a", "bc", "d"]
    # merges look at the joined text: "a" + "bc" makes "abc"
    tok = _tiny([*chars, ("ab", -2.0, NORMAL), ("bc", -1.0, NORMAL), ("cd", -3.0, NORMAL),
                         ("abc", -5.0, NORMAL)])
    assert _pieces(tok, "abcd") == ["abc", "d"]
    # without "bc", "ab" (-2) beats "cd" (-3) but they do not overlap: both apply
    tok = _tiny([*chars, ("ab", -2.0, NORMAL), ("cd", -3.0, NORMAL)])
    assert _pieces(tok, "abcd") == ["ab", "cd"]


def test_merge_ties_go_leftmost() -> None:
    chars = [(c, -10.0, NORMAL) for c in "abc"]
    tok = _tiny([*chars, ("bc", -1.0, NORMAL), ("ab", -1.0, NORMAL)])
    assert _pieces(tok, "abc") == ["ab", "c"]
    assert _pieces(tok, "aabc") == ["a", "ab", "c"]
    assert _pieces(tok, "bcab") == ["bc", "ab"]
    tok = _tiny([*chars, ("aa", -1.0, NORMAL)])
    assert _pieces(tok, "aaa") == ["aa", "a"]


def test_merges_reach_pieces_whose_halves_are_missing() -> None:
    # "xy" is in the vocabulary, "x" and "y" alone are not: they would fall back to
    # bytes, but the pair merges first.
    tok = _tiny([("xy", -1.0, NORMAL), ("z", -1.0, NORMAL)])
    assert _pieces(tok, "xyz") == ["xy", "z"]
    assert _pieces(tok, "yx") == ["<0x79>", "<0x78>"]


def test_spaces_become_the_marker_and_words_merge_with_it() -> None:
    vocab = [(MARK, -10.0, NORMAL), ("a", -10.0, NORMAL), ("b", -10.0, NORMAL),
             (MARK + "b", -1.0, NORMAL), ("a" + MARK, -2.0, NORMAL)]
    tok = _tiny(vocab)
    assert _pieces(tok, "a b") == ["a", MARK + "b"]
    assert _pieces(tok, "a a") == ["a" + MARK, "a"]
    assert tok.decode(tok.encode("a b a", add_bos=False)) == b"a b a"
    # a piece with an inner marker joins words: "a▁" lets "a" take the space
    assert _pieces(tok, "ba a") == ["b", "a" + MARK, "a"]


def test_byte_fallback_and_unknown() -> None:
    tok = _tiny([("a", -1.0, NORMAL)])
    assert _pieces(tok, "aé") == ["a", "<0xC3>", "<0xA9>"]
    # no byte tokens: the unknown token stands for each byte
    vocab = ["<unk>", "a"]
    bare = Tokenizer.from_vocab(vocab, [0.0, -1.0], [2, NORMAL], unk_id=0)
    assert bare.encode("ab", add_bos=False) == [1, 0]
    assert bare.token_bytes(0) == b"<unk>"
    no_unk = Tokenizer.from_vocab(["a"], [0.0], [NORMAL])
    with pytest.raises(errors.InvalidInput) as exc:
        no_unk.encode("ab")
    assert exc.value.code == "byte_fallback_invalid"


def test_special_pieces_match_whole_and_longest_first() -> None:
    vocab = [("a", -1.0, NORMAL), ("<", -1.0, NORMAL), (">", -1.0, NORMAL),
             ("<t>", 0.0, CONTROL), ("<u>", 0.0, USER_DEFINED), ("<u><u>", 0.0, USER_DEFINED),
             ("au", -0.5, NORMAL), ("u", -1.0, NORMAL)]
    tok = _tiny(vocab)
    assert _pieces(tok, "a<u>a") == ["a", "<u>", "a"]            # user-defined: always
    assert _pieces(tok, "<u><u><u>") == ["<u><u>", "<u>"]        # longest first
    assert _pieces(tok, "a<t>") == ["a", "<", "<0x74>", ">"]     # control: text ...
    assert _pieces(tok, "a<t>", parse_special=True) == ["a", "<t>"]  # ... unless asked
    # a special piece splits the text: "a" and "u" cannot merge across it
    assert _pieces(tok, "a<u>u") == ["a", "<u>", "u"]
    assert _pieces(tok, "au") == ["au"]


def test_add_space_prefix_and_its_removal() -> None:
    vocab = [(MARK, -10.0, NORMAL), ("a", -10.0, NORMAL), (MARK + "a", -1.0, NORMAL)]
    tok = _tiny(vocab, add_space_prefix=True, add_bos=True)
    assert _pieces(tok, "a a") == [MARK + "a", MARK + "a"]
    ids = tok.encode("a a")
    assert ids[0] == 1
    assert tok.decode(ids) == b"a a"
    assert tok.decode(tok.encode(" a")) == b" a"
    d = tok.detokenizer()
    assert [d.push(i) for i in ids] == [b"", b"a", b" a"]


def test_types_absent_reads_byte_pieces() -> None:
    tok = Tokenizer.from_vocab([b"<0x41>", b"b"], [0.0, -1.0])
    assert tok.token_type(0) == BYTE and tok.token_bytes(0) == b"A"
    assert tok.encode("Ab") == [0, 1]


def test_bad_vocabularies_are_refused_with_their_field() -> None:
    with pytest.raises(errors.FormatError) as fmt:
        Tokenizer.from_vocab([b"<0xZZ>"], [0.0], [BYTE])
    assert fmt.value.code == "tokenizer_vocab_corrupt" and "tokens[0]" in fmt.value.message
    with pytest.raises(errors.InvalidInput, match="bos_id"):
        Tokenizer.from_vocab([b"a"], bos_id=5)
    with pytest.raises(errors.InvalidInput, match="types"):
        Tokenizer.from_vocab([b"a"], [0.0], [9])
    with pytest.raises(errors.InvalidInput, match="scores"):
        Tokenizer.from_vocab([b"a", b"b"], [0.0])
    with pytest.raises(errors.InvalidInput, match="empty"):
        Tokenizer.from_vocab([])
    tok = Tokenizer.from_vocab([b"a"])
    with pytest.raises(errors.InvalidInput) as bos:
        tok.encode("a", add_bos=True)
    assert bos.value.code == "bos_token_invalid"
    with pytest.raises(errors.InvalidInput):
        tok.token_bytes(1)
    # the native checks stand on their own too
    out = ffi.new("aotx_tokenizer **")
    params = ffi.new("aotx_tokenizer_params *", {"bos_id": 3, "eos_id": -1, "unk_id": -1,
                                                 "pad_id": -1})
    toks = [ffi.new("char[]", b"a")]
    arr = ffi.new("char *[]", toks)
    assert lib.aotx_tokenizer_new(params, 1, arr, ffi.NULL, ffi.NULL, ffi.NULL, out) == \
        lib.AOTX_E_TOKENIZER_SPECIAL
    params.bos_id = -1
    types = ffi.new("int32_t[]", [7])
    assert lib.aotx_tokenizer_new(params, 1, arr, ffi.NULL, ffi.NULL, types, out) == \
        lib.AOTX_E_TOKENIZER_TYPE
