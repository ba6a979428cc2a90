"""The engine on the real default text model (Gemma 3 270M Q4_K_M).

The model is a base (pre-trained) model: greedy decoding of "The capital of
France is" continues " the capital of the country. It is the largest city in
France..." (our numpy reference, tests/reference_decoder.py, ranks the same
top tokens: " the", " a", " Paris"); a question-and-answer prompt answers
"Paris".
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from _real import real_gguf

from aotx_trio.native.engine import Engine

MODEL = real_gguf()


@pytest.fixture(scope="module")
def eng() -> Iterator[Engine]:
    with Engine.load(MODEL, threads=2, max_seqs=2, max_tokens=2048) as e:
        yield e


def reads_as_language(text: str) -> bool:
    words = re.findall(r"[A-Za-z]+", text)
    letters = sum(len(w) for w in words)
    return len(words) >= 5 and letters >= 0.6 * len(text)


def test_greedy_continuation_is_deterministic_language(eng: Engine) -> None:
    a = b"".join(eng.generate("The capital of France is", max_tokens=24)).decode()
    assert eng.last.prompt_tokens == [2, 818, 5279, 529, 7001, 563]
    b = b"".join(eng.generate("The capital of France is", max_tokens=24)).decode()
    assert a == b
    assert reads_as_language(a), a
    assert "capital" in a or "Paris" in a, a


def test_question_answer_says_paris(eng: Engine) -> None:
    out = b"".join(eng.generate("Q: What is the capital of France?\nA:", max_tokens=12)).decode()
    assert "Paris" in out, out


def test_prompt_longer_than_the_sliding_window(eng: Engine) -> None:
    facts = ("Berlin is the capital of Germany. Madrid is the capital of Spain. Rome is the "
             "capital of Italy. Lisbon is the capital of Portugal. Vienna is the capital of "
             "Austria. ")
    prompt = facts * 18 + "Q: What is the capital of France?\nA:"
    ids = eng.tokenize(prompt)
    assert len(ids) > 600 > eng.info.window
    out = b"".join(eng.generate(prompt, max_tokens=16)).decode()
    assert reads_as_language(out), out
    assert "Paris" in out, out
    # the same by hand: the sliding layers' pages out of the window are gone
    seq = eng.add_sequence()
    res = eng.prefill(seq, ids)
    st = eng.kv_stats()
    full = -(-len(ids) // st.page_tokens)
    assert st.used_pages < st.n_groups * full
    toks = [eng.sample(seq, res, 0)]
    for _ in range(3):
        toks.append(eng.sample(seq, eng.step([(seq, toks[-1:])]), 0))
    assert toks == eng.last.tokens[:4]
    eng.release(seq)
