"""SentencePiece ("llama") vocabularies, as Gemma 2 (no space prefix) and Llama 2 /
Phi-3 (a space prefix) carry them: ids equal the `tokenizers` library's on a vocabulary
trained here, run as those models' tokenizer.json runs it (a BPE over the whole
"\u2581"-spelled text with byte fallback, one merge per way of joining two pieces,
ranked by the joined piece's score), and the same through the engine from synthetic
gemma2 / phi3 GGUFs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest
import synth_gguf
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tokenizer_bpe import HAND, corpus
from tokenizers import Regex, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from aotx_trio.native.engine import Engine
from aotx_trio.native.tokenizer import BYTE, CONTROL, NORMAL, Tokenizer

MARK = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def normalizer(space_prefix: bool) -> Any:
    spaces = normalizers.Replace(" ", MARK)
    return normalizers.Sequence([normalizers.Prepend(MARK), spaces]) if space_prefix else spaces


class SpmPair:
    """A vocabulary trained on the corpus (pieces start at their word's marker; 60
    characters, the rest byte fallback), scores -rank of the merge that made each piece;
    the reference `tokenizers` BPE and ours (aotx_tokenizer, score-ordered merges) on it."""

    def __init__(self, space_prefix: bool, vocab_size: int = 900) -> None:
        trainer_tok = HFTokenizer(BPE())
        trainer_tok.normalizer = normalizer(space_prefix)
        trainer_tok.pre_tokenizer = pre_tokenizers.Split(Regex(MARK + "*[^" + MARK + "]*"),
                                                         behavior="isolated")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, limit_alphabet=60,
                                      show_progress=False)
        trainer_tok.train_from_iterator(corpus(seed=3), trainer)
        model = trainer_tok.get_vocab()
        trained = sorted(model, key=lambda p: model[p])
        singles = [p for p in trained if len(p) == 1]
        merged = [p for p in trained if len(p) > 1]   # in the order the trainer made them
        self.tokens = SPECIALS + BYTES + singles + merged
        self.types = [CONTROL] * 3 + [BYTE] * 256 + [NORMAL] * (len(singles) + len(merged))
        self.scores = [0.0] * (3 + 256) + [-1e4] * len(singles)
        self.scores += [-float(r) for r in range(len(merged))]
        known = set(singles) | set(merged)
        merges = [(p[:i], p[i:]) for p in merged for i in range(1, len(p))
                  if p[:i] in known and p[i:] in known]
        vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ref = HFTokenizer(BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
        self.ref.normalizer = normalizer(space_prefix)
        self.space_prefix = space_prefix
        self.ours = Tokenizer.from_vocab(self.tokens, self.scores, self.types, bos_id=1,
                                         eos_id=2, unk_id=0, add_space_prefix=space_prefix)

    def want(self, text: str) -> list[int]:
        return list(self.ref.encode(text, add_special_tokens=False).ids)

    def check(self, text: str) -> None:
        got = self.ours.encode(text, add_bos=False)
        assert got == self.want(text), (text, got, self.want(text))
        assert self.ours.decode(got) == text.encode()


_PAIRS: dict[bool, SpmPair] = {}


def cached(space_prefix: bool) -> SpmPair:
    if space_prefix not in _PAIRS:
        _PAIRS[space_prefix] = SpmPair(space_prefix)
    return _PAIRS[space_prefix]


PREFIX = [False, True]   # Gemma 2; Llama 2 / Phi-3


@pytest.mark.parametrize("space_prefix", PREFIX)
def test_hand_cases_equal_reference(space_prefix: bool) -> None:
    p = cached(space_prefix)
    for text in HAND:
        if text:   # the reference prepends its marker even to nothing
            p.check(text)
    assert p.ours.encode("", add_bos=False) == []


@pytest.mark.parametrize("space_prefix", PREFIX)
def test_corpus_lines_equal_reference(space_prefix: bool) -> None:
    p = cached(space_prefix)
    lines = corpus(seed=11, lines=300)
    for line in lines:
        p.check(line)
    ids = [i for line in lines for i in p.ours.encode(line, add_bos=False)]
    # the vocabulary is exercised: merged pieces and byte fallback both occur
    assert sum(p.types[i] == BYTE for i in ids) > 100
    assert sum(len(p.tokens[i]) > 1 and p.types[i] == NORMAL for i in ids) > len(ids) // 3


@pytest.mark.parametrize("space_prefix", PREFIX)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("the capital France Paris café 東京😀\n\t  !'.,"),
                    min_size=1, max_size=60))
def test_random_text_equals_reference(space_prefix: bool, text: str) -> None:
    cached(space_prefix).check(text)


def write_spm_model(path: Path, p: SpmPair, arch: str) -> Path:
    """synth_gguf's model of `arch` with p's vocabulary, add_space_prefix as the family's
    converter writes it."""
    voc = synth_gguf.Vocab(p.tokens, p.types, p.scores, space_prefix=p.space_prefix)
    return synth_gguf.write_model(path, synth_gguf.tiny(arch, voc, n_layers=2,
                                                        embd_type=synth_gguf.Q.F32))


@pytest.mark.parametrize("arch,space_prefix", [("gemma2", False), ("phi3", True)])
def test_engine_tokenizes_the_family_vocabulary(tmp_path: Path, arch: str,
                                                space_prefix: bool) -> None:
    p = cached(space_prefix)
    path = write_spm_model(tmp_path / f"{arch}.gguf", p, arch)
    with Engine.load(path, threads=1, max_seqs=2) as e:
        assert e.info.arch == arch
        for text in ("Hello world, it's Paris!", "東京 😀 café\n\n  x", " the  capital "):
            want = p.want(text)
            assert e.tokenize(text, add_bos=False) == want
            assert e.tokenize(text) == [2, *want]   # synth_gguf's BOS id
            # the engine's detokenize joins the pieces' bytes (the prefix space stays);
            # the tokenizer's decode drops it
            lead = b" " if space_prefix else b""
            assert e.detokenize(e.tokenize(text)) == lead + text.encode()
    tok = Tokenizer.from_gguf_fields(gguf.GGUFReader(path))
    assert tok.add_bos and tok.model == "llama"
    assert tok.decode(tok.encode(" the  capital ")) == b" the  capital "
