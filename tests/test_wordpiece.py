"""aotx_trio/native/_wordpiece.py + csrc/tokenizer/tokenizer_wordpiece.c: WordPiece against the
`tokenizers` library on the real all-MiniLM-L6-v2 tokenizer.json (hand-picked cases
and random text), against the Python oracle (tests/wordpiece_oracle.py) on random
text from all of Unicode and every normalizer flag, and refusals."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_bert import real_model_zip, tiny_tokenizer_json
from wordpiece_oracle import OracleWordPiece

from aotx_trio import errors
from aotx_trio.native.embed import WordPiece
from aotx_trio.native.lib import ffi, lib

MAX_LEN = 256   # the real model's max_seq_length


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("minilm-tok")
    with zipfile.ZipFile(real_model_zip()) as zf:
        zf.extract("tokenizer.json", dest)
    return dest / "tokenizer.json"


@pytest.fixture(scope="module")
def wp(tokenizer_json: Path) -> WordPiece:
    return WordPiece(tokenizer_json, MAX_LEN)


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_json: Path) -> object:
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)
    return tok


VERY_LONG = "The quick brown fox jumps over the lazy dog, again and again. " * 40  # truncated
WORDPIECE_CASES = [
    "Hello, world! How are you?",
    "Héllo naïve café résumé Ångström Øresund façade",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ ß ẞ",
    "你好，世界！ 日本語のテキスト 한국어 텍스트",  # noqa: RUF001
    "Mixed中文and English混合text",
    "unbelievably antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 101,
    "y" * 100,
    "qwxzjvk flibbertigibbetzz zzyzx",
    "e-mail: someone@example.com, url: https://example.org/a?b=c&d=e#f",
    "tabs\tand\nnewlines\r\nand  double  spaces\u3000ideographic\u00a0nbsp",
    "zero\u200bwidth\u200djoiner\ufeffbom and control\x01\x07chars\x7f",
    "replacement \ufffd char and null \x00 byte",
    "Ελληνικά ΟΔΟΣ σοφία, Русский текст, עברית, العربية",
    "İstanbul ǅemal ﬁnance Ⅻ ① ²³",
    "emoji 😀👍🏽 and ❤️ flags 🇫🇷",
    "$100 + 20% = <less> ^caret^ `tick` |pipe| ~tilde~ €5 £3 ¥7",
    "dashes – — and quotes “curly” ‘single’ «guillemets» …ellipsis",  # noqa: RUF001
    "numbers 3.14159 1,000,000 2nd 42nd",
    "special tokens [CLS] inside [SEP] text [MASK] and [PAD][UNK]",
    "combining a\u0301 e\u0308 devanagari हिन्दी thai ภาษาไทย",
    "",
    "   ",
    VERY_LONG,
]


@pytest.mark.parametrize("text", WORDPIECE_CASES)
def test_wordpiece_matches_tokenizers(wp: WordPiece, hf_tokenizer: object, text: str) -> None:
    expected = hf_tokenizer.encode(text).ids  # type: ignore[attr-defined]
    assert wp.encode(text) == expected


def test_truncation_keeps_cls_and_sep(wp: WordPiece) -> None:
    ids = wp.encode(VERY_LONG)
    assert len(ids) == MAX_LEN and ids[0] == wp.cls and ids[-1] == wp.sep
    assert wp.pieces(VERY_LONG, 5) == ids[1:6]


_ALPHABET = st.one_of(
    st.characters(min_codepoint=0, max_codepoint=0x17F),
    st.characters(min_codepoint=0x300, max_codepoint=0x36F),    # combining marks
    st.characters(min_codepoint=0x370, max_codepoint=0x4FF),    # Greek, Cyrillic
    st.characters(min_codepoint=0x2000, max_codepoint=0x206F),  # punctuation, spaces, Cf
    st.characters(min_codepoint=0x3000, max_codepoint=0x303F),
    st.characters(min_codepoint=0x4E00, max_codepoint=0x4E80),  # CJK
    st.sampled_from(["the", "cat", "##", "[SEP]", " ", "ing", "un", "É"]),
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_ALPHABET, max_size=40).map("".join))
def test_wordpiece_matches_tokenizers_on_random_text(wp: WordPiece, hf_tokenizer: object,
                                                     text: str) -> None:
    assert wp.encode(text) == hf_tokenizer.encode(text).ids  # type: ignore[attr-defined]


def test_wordpiece_rejects_tokenizer_without_specials(tmp_path: Path) -> None:
    raw = tiny_tokenizer_json()
    del raw["model"]["vocab"]["[SEP]"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(raw))
    with pytest.raises(errors.ConfigError, match=r"\[SEP\]"):
        WordPiece(tmp_path / "tokenizer.json", 16)


# ------------------------------------------------------------------ C against the Python oracle

_ANY = st.one_of(
    st.integers(0, 0x10FFFF).map(chr),                            # everything, surrogates too
    st.characters(min_codepoint=0x300, max_codepoint=0x36F),      # combining marks
    st.characters(min_codepoint=0x1E00, max_codepoint=0x1FFF),    # precomposed Latin, Greek
    st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),    # Hangul syllables
    st.sampled_from(["\u0130", "\u03a3", "\U0001d16d", "\U0001d165", "\u0f71", "\u0f72",
                     "\u1e9e", "\ufb01", " ", "##", "[SEP]", "[CLS]", "the", "ing"]),
)


@pytest.fixture(scope="module")
def oracle(tokenizer_json: Path) -> OracleWordPiece:
    return OracleWordPiece(tokenizer_json, MAX_LEN)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_ANY, max_size=60).map("".join), st.integers(0, 12))
def test_c_matches_the_oracle(wp: WordPiece, oracle: OracleWordPiece, text: str,
                              limit: int) -> None:
    assert wp.pieces(text) == oracle.pieces(text)
    assert wp.pieces(text, limit) == oracle.pieces(text, limit)


@pytest.mark.parametrize("flags", [
    {"clean_text": False}, {"handle_chinese_chars": False}, {"strip_accents": False},
    {"lowercase": False}, {"lowercase": False, "strip_accents": True},
    {"clean_text": False, "handle_chinese_chars": False, "lowercase": False}])
def test_normalizer_flags_match_the_oracle(tokenizer_json: Path, tmp_path: Path,
                                           flags: dict[str, bool]) -> None:
    raw = json.loads(tokenizer_json.read_text())
    raw["normalizer"].update(flags)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(raw))
    wp, oracle = WordPiece(path, MAX_LEN), OracleWordPiece(path, MAX_LEN)
    texts = [*WORDPIECE_CASES, "\x0b\x0cVT FF\x85NEL", "ÉCOLE Straße", "a\u0301\u0328b"]
    for text in texts:
        assert wp.pieces(text) == oracle.pieces(text), text


def custom(tmp_path: Path, pieces: list[str], **model: object) -> Path:
    raw = tiny_tokenizer_json()
    vocab = raw["model"]["vocab"]
    for p in pieces:
        vocab[p] = len(vocab)
    raw["model"].update(model)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(raw))
    return path


def test_nfd_orders_combining_marks_hangul_and_full_lowercase(tmp_path: Path) -> None:
    pieces = ["\U0001d165\U0001d16d", "\u1100\u1161\u11a8", "i\u0307", "ss", "e"]
    wp = WordPiece(custom(tmp_path, pieces), 64)
    ids = {p: wp.vocab[p] for p in pieces}
    # two kept marks (Mc, classes 226 then 216) come out in canonical order
    assert wp.pieces("\U0001d16d\U0001d165") == [ids["\U0001d165\U0001d16d"]]
    assert wp.pieces("\uac01") == [ids["\u1100\u1161\u11a8"]]          # 각 -> L V T jamo
    assert wp.pieces("\u00e9") == wp.pieces("e\u0301") == [ids["e"]]
    assert wp.pieces("\u1e9e") == [wp.vocab["[UNK]"]]                   # ẞ -> ß, not "ss"
    assert wp.pieces("\u0130") == wp.pieces("i")    # İ = I + U+0307 (NFD), the mark stripped
    path = custom(tmp_path, pieces)
    raw = json.loads(path.read_text())
    raw["normalizer"]["strip_accents"] = False
    path.write_text(json.dumps(raw))
    kept = WordPiece(path, 64)                       # no strip: the full lowercase of İ
    assert kept.pieces("\u0130") == [kept.vocab["i\u0307"]]


def test_greedy_longest_match_prefix_and_word_limit(tmp_path: Path) -> None:
    path = custom(tmp_path, ["un", "unbe", "##be", "##liev", "##able", "%%x"],
                  continuing_subword_prefix="%%", max_input_chars_per_word=8)
    wp = WordPiece(path, 64)
    v = wp.vocab
    assert wp.pieces("unx") == [v["un"], v["%%x"]]
    assert wp.pieces("unbex") == [v["unbe"], v["%%x"]]
    assert wp.pieces("unbexq") == [v["[UNK]"]]           # an unmatchable rest: one unk
    assert wp.pieces("unxxxxxxx") == [v["[UNK]"]]        # 9 chars > 8
    assert wp.pieces("un [CLS]un") == [v["un"], v["[CLS]"], v["un"]]   # added tokens first
    assert wp.pieces("un" * 5, 0) == []


def test_a_small_buffer_reports_the_count_needed(wp: WordPiece, oracle: OracleWordPiece) -> None:
    text = "!" * 5000 + " caf\u00e9" * 300
    want = oracle.pieces(text)
    assert wp.pieces(text) == want and len(want) > 5000
    data = text.encode()
    buf, n = ffi.new("int32_t[]", 3), ffi.new("int64_t *")
    rc = lib.aotx_wordpiece_encode(wp._native, data, len(data), -1, buf, 3, n)
    assert rc == lib.AOTX_E_BUFFER_TOO_SMALL and n[0] == len(want)
    assert list(buf) == want[:3]
    assert lib.aotx_wordpiece_encode(wp._native, data, len(data), 2, buf, 3, n) == 0
    assert n[0] == 2


def test_bad_native_params_are_refused() -> None:
    p = ffi.new("aotx_wordpiece_params *")
    out = ffi.new("aotx_wordpiece **")
    assert lib.aotx_wordpiece_new(p, out) == lib.AOTX_E_INVALID_ARGUMENT
    assert out[0] == ffi.NULL
