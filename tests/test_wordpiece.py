"""aotx_trio/_wordpiece.py: WordPiece against the `tokenizers` library on the real
all-MiniLM-L6-v2 tokenizer.json (hand-picked cases and random text), and refusals."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_bert import real_model_zip, tiny_tokenizer_json

from aotx_trio import errors
from aotx_trio.embed import WordPiece

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
