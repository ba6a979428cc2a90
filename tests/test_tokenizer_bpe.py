"""Byte-level BPE ("gpt2" vocabularies): ids equal the `tokenizers` library's on
vocabularies trained here, exact bytes back, and a synthetic llama GGUF with a
gpt2 vocabulary through the engine."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import gguf
import pytest
import synth_gguf
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from aotx_trio import errors
from aotx_trio.native.engine import Engine
from aotx_trio.native.lib import ffi, lib
from aotx_trio.native.tokenizer import CONTROL, NORMAL, Tokenizer

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
SPECIALS = ["<|pad|>", "<|eos|>", "<|bos|>", "<|unk|>", "<|eot|>"]
MODES = ("gpt2", "llama3", "qwen2", "smollm")

WORDS = ("the", "capital", "of", "France", "is", "Paris", "don't", "we're", "It's", "café",
         "naïve", "Zürich", "déjà", "vu", "東京", "日本語", "の", "テスト", "中文", "😀", "🎉👍",
         "hello", "WORLD", "I'LL", "they've", "x=1;", "(a+b)", "--", "...", "$100", "3.14159",
         "2024", "123456789", "e-mail", "naïveté", "Ελλάδα", "Россия", "مرحبا", "\t", "\u017f")


def corpus(seed: int = 7, lines: int = 400) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        parts = []
        for _ in range(rng.randint(3, 14)):
            w = rng.choice(WORDS)
            parts.append(w + rng.choice(["", "", ",", ".", "!", "?", "'s"]))
            parts.append(rng.choice([" ", " ", " ", "  ", "\n", " \n", "\n\n", "   "]))
        out.append("".join(parts))
    return out


def pre_tokenizer(mode: str) -> Any:
    if mode == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if mode == "smollm":     # SmolLM2's tokenizer.json
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    pattern = LLAMA3 if mode == "llama3" else QWEN2
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def byte_level(text: str) -> str:
    """GPT-2's bytes-to-unicode spelling of text's UTF-8 bytes."""
    table = pre_tokenizers.ByteLevel.alphabet()
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    others = [b for b in range(256) if b not in printable]
    m = {b: chr(b) for b in printable} | {b: chr(0x100 + k) for k, b in enumerate(others)}
    assert set(m.values()) == set(table)
    return "".join(m[b] for b in text.encode())


# Words given top-priority merges (each prefix joined with its next character), so
# the pre-tokenizer's cuts decide the ids: digit groups, folded contractions.
CHAIN_WORDS = ("123456", "'\u017ft", "'REd", "'Llama")
# Tokens no merge produces: only Llama-3's ignore_merges may emit them.
LONE_TOKENS = ("Ġzebra", "zebra")


class Pair:
    """A trained reference (`tokenizers`) and ours built from its vocab and merges,
    with CHAIN_WORDS merges first and LONE_TOKENS added."""

    def __init__(self, mode: str, vocab_size: int = 700) -> None:
        trainer_tok = HFTokenizer(BPE())
        trainer_tok.pre_tokenizer = pre_tokenizer(mode)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        trainer_tok.train_from_iterator(corpus(), trainer)
        model = json.loads(trainer_tok.to_str())["model"]
        vocab: dict[str, int] = model["vocab"]
        trained = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                   for m in model["merges"]]
        chain: list[tuple[str, str]] = []
        for word in CHAIN_WORDS:
            b = byte_level(word)
            for i in range(1, len(b)):
                chain.append((b[:i], b[i]))
                vocab.setdefault(b[:i + 1], len(vocab))
        for t in LONE_TOKENS:
            vocab.setdefault(t, len(vocab))
        merges = list(dict.fromkeys(chain + trained))   # no duplicate pairs
        self.ref = HFTokenizer(BPE(vocab, merges, ignore_merges=mode == "llama3"))
        self.ref.pre_tokenizer = pre_tokenizer(mode)
        self.ref.add_special_tokens(SPECIALS)
        self.tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        assert [vocab[t] for t in self.tokens] == list(range(len(self.tokens)))
        self.merges = [f"{a} {b}" for a, b in merges]
        self.types = [CONTROL if t in SPECIALS else NORMAL for t in self.tokens]
        self.ours = Tokenizer.from_bpe(self.tokens, self.merges, self.types, pre=mode,
                                       bos_id=2, eos_id=1, add_bos=False)

    def check(self, text: str) -> None:
        want = self.ref.encode(text, add_special_tokens=False).ids
        got = self.ours.encode(text, parse_special=True)
        assert got == want, (text, got, want)
        plain = text
        for sp in SPECIALS:   # control tokens decode to nothing
            plain = plain.replace(sp, "")
        assert self.ours.decode(got) == plain.encode()


@pytest.fixture(scope="module", params=MODES)
def pair(request: pytest.FixtureRequest) -> Pair:
    return Pair(request.param)


_PAIRS: dict[str, Pair] = {}


def cached(mode: str) -> Pair:
    if mode not in _PAIRS:
        _PAIRS[mode] = Pair(mode)
    return _PAIRS[mode]


HAND = [
    "", " ", "  ", "\n", "\n\n", " \n ", "a", "Hello world", "Hello  world", "Hello   world ",
    "don't stop", "DON'T STOP", "it'S we'RE they'Ve I'LL", "'s", "x'\u017f", "''s", "'", "1", "12",
    "1234567", "12345 678 9", "3.14159", "$100,000.00", "a1b2c3", "café naïve déjà vu",
    "東京は日本語のテスト", "中文 中文", "😀🎉👍", "smile 😀!", "tab\there", "\t\tx",
    "line1\r\nline2",
    "a \n\n b", "x  \n  y", "end   ", "   start", "(hello)", "((()))", "a--b...c",
    "<|eot|>", "hi<|eot|>there", "<|bos|> <|eos|>", "Ελλάδα Россия مرحبا", "\u00a0nbsp\u3000x",
    "x\u2028y", "\x1c\x1d", "e\u0301", "ZÜRICH zürich", "naïveté's", "It's 2024!\n\nOK",
    "emoji🎉in word", "   \n\t  \r\n  x", "!!!\n\n\nabc", " 'll", "\n'd",
    "123456", "1234567 123456", "it'\u017ft", "'\u017ft", "we'REd", "'Llama", "I'Ll",
    "a zebra", "zebra!", "x 1", "x  1", "x   12 3", " 1", "  1", "\n 1", "\n\n1", "! 1", "a\t 2b",
    "\u0663\u0664 \u00bd x", "9 ", "9  a",
]


@pytest.mark.parametrize("mode", MODES)
def test_hand_cases_equal_reference(mode: str) -> None:
    p = cached(mode)
    assert len(p.merges) > 100   # the vocabulary really merges
    for text in HAND:
        p.check(text)


@pytest.mark.parametrize("mode", MODES)
def test_corpus_lines_equal_reference(mode: str) -> None:
    p = cached(mode)
    lines = corpus(seed=99, lines=60)
    for line in lines:
        p.check(line)
    long = "".join(lines)[:2000]   # a 2,000-byte prompt in one call
    p.check(long)


_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cn")), max_size=30)
_MIXED = st.lists(st.sampled_from([*WORDS, " ", "  ", "\n", "'", "'S", "9", "\r\n"]),
                  max_size=12).map("".join)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=80, deadline=None)
@given(text=st.one_of(_TEXT, _MIXED))
def test_random_text_equals_reference(mode: str, text: str) -> None:
    cached(mode).check(text)


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=40))
def test_any_bytes_round_trip(data: bytes) -> None:
    for mode in MODES:
        tok = cached(mode).ours
        ids = tok.encode(data)
        assert tok.decode(ids) == data
        assert b"".join(tok.token_bytes(i) for i in ids) == data


def test_token_bytes_unmap_byte_level_pieces() -> None:
    p = cached("gpt2")
    tok = p.ours
    space_the = p.tokens.index("Ġthe")
    assert tok.token_bytes(space_the) == b" the"
    assert tok.piece(space_the) == "Ġthe".encode()
    assert tok.token_bytes(p.tokens.index("Ċ")) == b"\n"
    assert tok.token_bytes(p.tokens.index("Ã")) == b"\xc3"   # U+00C3 is byte C3
    assert tok.token_bytes(p.tokens.index("Ā")) == b"\x00"   # U+0100: the first unprintable
    assert tok.token_bytes(2) == b""                         # control: nothing
    assert tok.model == "gpt2" and tok.pre == "gpt2"
    assert cached("llama3").ours.pre == "llama3"
    assert cached("qwen2").ours.pre == "qwen2"


def test_detokenizer_holds_split_characters() -> None:
    tok = cached("gpt2").ours
    text = "x😀é東"
    ids = [tok.encode(bytes([b]))[0] for b in text.encode()]   # one token per byte
    assert len(ids) == len(text.encode())
    d = tok.detokenizer()
    outs = [d.push(i) for i in ids]
    assert outs == [b"x", b"", b"", b"", "😀".encode(), b"", "é".encode(), b"", b"",
                    "東".encode()]
    assert d.flush() == b""
    # A stream cut mid-character keeps the tail until flush.
    d2 = tok.detokenizer()
    assert d2.push(ids[1]) == b"" and d2.flush() == b"\xf0"
    # Real encodes: every output is whole UTF-8 and the join is exact.
    for line in corpus(seed=5, lines=30):
        d3 = tok.detokenizer()
        parts = [d3.push(i) for i in tok.encode(line)] + [d3.flush()]
        for part in parts:
            part.decode()
        assert b"".join(parts) == line.encode()


def test_specials_need_parse_special() -> None:
    tok = cached("llama3").ours
    eot = SPECIALS.index("<|eot|>")
    assert eot in tok.encode("a<|eot|>b", parse_special=True)
    plain = tok.encode("a<|eot|>b")
    assert eot not in plain and tok.decode(plain) == b"a<|eot|>b"
    assert tok.encode("hi", add_bos=True)[0] == 2


def test_add_space_prefix() -> None:
    p = cached("gpt2")
    tok = Tokenizer.from_bpe(p.tokens, p.merges, p.types, add_space_prefix=True)
    assert tok.encode("the") == p.ours.encode(" the")
    assert tok.decode(tok.encode("the")) == b"the"


def test_unknown_pre_is_refused() -> None:
    p = cached("gpt2")
    with pytest.raises(errors.UnsupportedProfile, match="'tiktoken-x'"):
        Tokenizer.from_bpe(p.tokens, p.merges, pre="tiktoken-x")
    out = ffi.new("int32_t *")
    for name in (b"tiktoken-x", b"llama", b""):
        assert lib.aotx_tokenizer_pre_parse(name, len(name), out) == lib.AOTX_E_TOKENIZER_PRE
    assert lib.aotx_tokenizer_pre_parse(b"llama-bpe", 9, out) == 0 and out[0] == 1
    assert lib.aotx_tokenizer_pre_parse(ffi.NULL, 0, out) == 0 and out[0] == 0
    assert lib.aotx_tokenizer_model_parse(b"bert", 4, out) == lib.AOTX_E_TOKENIZER_MODEL
    assert lib.aotx_tokenizer_model_parse(b"gpt2", 4, out) == 0 and out[0] == 1
    # The C constructor refuses a pre value it does not know.
    params = ffi.new("aotx_tokenizer_params *", {"bos_id": -1, "eos_id": -1, "unk_id": -1,
                                                 "pad_id": -1})
    tokens = [ffi.new("char[]", b"a")]
    h = ffi.new("aotx_tokenizer **")
    rc = lib.aotx_tokenizer_new_bpe(params, 9, 1, tokens, ffi.NULL, ffi.NULL, 0, ffi.NULL,
                                    ffi.NULL, h)
    assert rc == lib.AOTX_E_TOKENIZER_PRE
    assert ffi.string(lib.aotx_code_name(rc)) == b"tokenizer_pre_unsupported"


def test_bad_merges_are_refused() -> None:
    p = cached("gpt2")
    with pytest.raises(errors.InvalidInput, match=r"merges\[1\]"):
        Tokenizer.from_bpe(p.tokens, [p.merges[0], "nospace"])
    params = ffi.new("aotx_tokenizer_params *", {"bos_id": -1, "eos_id": -1, "unk_id": -1,
                                                 "pad_id": -1})
    keep = [ffi.new("char[]", t.encode()) for t in ("a", "b", "ab")]
    for merge in (b"a b c", b"a c", b"ab", b" ab", b"b a"):
        m = [ffi.new("char[]", merge)]
        h = ffi.new("aotx_tokenizer **")
        rc = lib.aotx_tokenizer_new_bpe(params, 0, 3, keep, ffi.NULL, ffi.NULL, 1, m, ffi.NULL, h)
        assert rc == lib.AOTX_E_TOKENIZER_MERGES, merge
    h = ffi.new("aotx_tokenizer **")
    rc = lib.aotx_tokenizer_new_bpe(params, 0, 3, keep, ffi.NULL, ffi.NULL, 1,
                                    [ffi.new("char[]", b"a b")], ffi.NULL, h)
    assert rc == 0
    tok = Tokenizer(ffi.gc(h[0], lib.aotx_tokenizer_free), None)
    assert tok.encode("abba") == [2, 1, 0]


# -- a synthetic llama GGUF with a gpt2 vocabulary, through the engine -----------------

def write_bpe_model(path: Path, p: Pair, pre: str, kind: str = "gpt2",
                    arch: str = "llama") -> Path:
    """synth_gguf's model of `arch` with p's byte-level vocabulary."""
    voc = synth_gguf.Vocab(p.tokens, p.types, model=kind, pre=pre, merges=p.merges)
    return synth_gguf.write_model(path, synth_gguf.tiny(arch, voc))


def test_engine_loads_gpt2_vocabulary(tmp_path: Path) -> None:
    p = cached("llama3")
    path = write_bpe_model(tmp_path / "llama-gpt2.gguf", p, "llama-bpe")
    with Engine.load(path, threads=1, max_seqs=2) as e:
        for text in ("Hello world, it's 2024!", "東京 😀 café\n\n  x", "don't stop 123456"):
            want = p.ref.encode(text, add_special_tokens=False).ids
            assert e.tokenize(text, add_bos=False) == want
            assert e.tokenize(text) == [2, *want]
            assert e.detokenize(e.tokenize(text)) == text.encode()
        assert e.tokenize("<|eot|>", add_bos=False, parse_special=True) == [4]
        assert e.tokenize("a zebra", add_bos=False) == [p.tokens.index("a"),
                                                        p.tokens.index("Ġzebra")]
    tok = Tokenizer.from_gguf_fields(gguf.GGUFReader(path))
    assert tok.model == "gpt2" and tok.pre == "llama3" and tok.add_bos
    assert tok.encode("It's 12345") == [2, *p.ref.encode("It's 12345").ids]


def test_engine_refuses_unknown_pre(tmp_path: Path) -> None:
    path = write_bpe_model(tmp_path / "bad-pre.gguf", cached("gpt2"), "mystery-pre")
    with pytest.raises(errors.AotxError, match=r"tokenizer\.ggml\.pre = .mystery-pre."):
        Engine.load(path, threads=1)
    with pytest.raises(errors.UnsupportedProfile, match="mystery-pre"):
        Tokenizer.from_gguf_fields(gguf.GGUFReader(path))


def test_engine_refuses_unknown_tokenizer_model(tmp_path: Path) -> None:
    path = write_bpe_model(tmp_path / "bert.gguf", cached("gpt2"), "default", kind="bert")
    with pytest.raises(errors.AotxError, match=r"tokenizer\.ggml\.model = .bert."):
        Engine.load(path, threads=1)


def test_unicode_tables_are_current() -> None:
    """csrc/tokenizer/tokenizer_unicode.c is what scripts/gen_unicode_tables.py writes."""
    import subprocess
    import sys
    import unicodedata

    root = Path(__file__).resolve().parent.parent
    committed = (root / "csrc" / "tokenizer" / "tokenizer_unicode.c").read_text()
    if f"(Unicode {unicodedata.unidata_version})" not in committed:
        pytest.skip(f"tables were generated for another Unicode than {unicodedata.unidata_version}")
    fresh = subprocess.run([sys.executable, str(root / "scripts" / "gen_unicode_tables.py")],
                           check=True, capture_output=True, text=True, timeout=120).stdout
    assert fresh == committed
