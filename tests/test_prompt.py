"""Context rendering by lease revision (runtime/prompt.py, "Revisions"), on the real
default model's tokenizer: revision 2 keeps its prompt bytes exactly (against the
function as it was before revisions existed), revisions 3..5 lay out the documented
pieces, and every revision keeps the budget rule."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _real import real_gguf

from aotx_trio.native.chat_template import LEGACY_MARKERS
from aotx_trio.native.engine import Engine
from aotx_trio.runtime.prompt import (
    DEFAULT_REVISION,
    HISTORICAL_RULE,
    Turn,
    _plain,
    lease_revision,
    render,
)

A, B, C = "pa1a1a1a1", "pb2b2b2b2", "pc3c3c3c3"


@pytest.fixture(scope="module")
def eng() -> Iterator[Engine]:
    with Engine.load(real_gguf(), max_seqs=1) as e:
        yield e


def _markers(engine: Engine) -> tuple[list[int], ...]:
    """The built-in (user, end, model) markers as tokens: the default model has no chat
    template, so they are its turns."""
    assert engine.chat_template is None
    return tuple(engine.tokenize(m, add_bos=False, parse_special=True) for m in LEGACY_MARKERS)


def _reference_v2(engine: Engine, history: list[Turn], current: Turn, budget: int,
                  memory: bytes = b"") -> list[int]:
    """``render`` exactly as it was before lease revisions (commit d9ec939)."""
    user, end, model = _markers(engine)
    bos = [engine.info.bos_id] if engine.info.bos_id >= 0 else []

    def block(turn: Turn, lead: bytes = b"") -> list[int]:
        out = user + _plain(engine, lead + turn.label.encode() + b": " + turn.text) + end
        if turn.output is not None and turn is not current:
            out += model + _plain(engine, turn.output) + end
        return out

    tail = block(current, memory) + model
    blocks: list[list[int]] = []
    used = len(bos) + len(tail)
    for turn in reversed(history):
        b = block(turn)
        if used + len(b) > budget:
            break
        blocks.append(b)
        used += len(b)
    tokens = list(bos)
    for b in reversed(blocks):
        tokens += b
    return tokens + tail


def history() -> list[Turn]:
    return [Turn(A, b"Hi, I am Alice."), Turn(A, b"I live in Lisbon."),
            Turn(B, b"I am Bob.", b"Hello Alice and Bob!"),
            Turn(B, "caf\u00e9 <start_of_turn> \u00fc".encode()),   # caller text, special off
            Turn(B, b"and more", b"Sure.")]


@pytest.mark.parametrize("revision", [0, 1, 2])
@pytest.mark.parametrize("budget", [10_000, 60, 35, 5])
def test_revision_2_keeps_its_prompt_bytes(eng: Engine, revision: int, budget: int) -> None:
    cur = Turn(C, b"What is the capital of France?")
    for memory in (b"", b"Notes recalled from this space:\n- the key is 42\n\n"):
        got = render(eng, history(), cur, budget, memory, revision)
        assert got == _reference_v2(eng, history(), cur, budget, memory)
    small = render(eng, [Turn(A, b"Hi", b"Hello")], Turn(B, b"Bye"), 10_000, revision=2)
    assert small == _pieces(eng, "BOS", "U", b"pa1a1a1a1: Hi", "E", "M", b"Hello", "E",
                            "U", b"pb2b2b2b2: Bye", "E", "M")
    assert eng.detokenize(small) == (          # (detokenize leaves control tokens out)
        b"user\npa1a1a1a1: Hi\nmodel\nHello\nuser\npb2b2b2b2: Bye\nmodel\n")


def _pieces(eng: Engine, *parts: bytes | str) -> list[int]:
    """Tokens of documented pieces: markers (str) special on, text (bytes) off."""
    user, end, model = _markers(eng)
    marks = {"U": user, "E": end, "M": model, "BOS": [eng.info.bos_id]}
    out: list[int] = []
    for p in parts:
        out += marks[p] if isinstance(p, str) else _plain(eng, p)
    return out


def test_revision_3_is_compact_with_the_historical_data_rule(eng: Engine) -> None:
    cur = Turn(C, b"Now?")
    got = render(eng, history(), cur, 10_000, revision=3)
    assert got == _pieces(
        eng, "BOS", "U", HISTORICAL_RULE,
        A.encode() + b": Hi, I am Alice.", b"\n", A.encode() + b": I live in Lisbon.", b"\n",
        B.encode() + b": I am Bob.", "E", "M", b"Hello Alice and Bob!", "E", "U",
        B.encode() + b": " + "caf\u00e9 <start_of_turn> \u00fc".encode(), b"\n",
        B.encode() + b": and more", "E", "M", b"Sure.", "E", "U",
        C.encode() + b": Now?", "E", "M")
    # recalled memory is its own piece before the current line, which keeps its label
    memory = b"Notes recalled from this space:\n- x\n\n"
    got = render(eng, [Turn(C, b"one")], Turn(C, b"two"), 10_000, memory, revision=4)
    assert got == _pieces(eng, "BOS", "U", HISTORICAL_RULE, C.encode() + b": one", b"\n",
                          memory, C.encode() + b": two", "E", "M")
    # the rule opens the context even with no history
    assert render(eng, [], cur, 10_000, revision=3) == _pieces(
        eng, "BOS", "U", HISTORICAL_RULE, C.encode() + b": Now?", "E", "M")
    assert b"<start_of_turn>" not in b"".join(
        eng.token_bytes(t) for t in got if t not in _markers(eng)[0])


@pytest.mark.parametrize("revision", [4, 5])
def test_revisions_4_and_5_share_repeated_labels(eng: Engine, revision: int) -> None:
    cur = Turn(B, b"Now?")
    got = render(eng, history(), cur, 10_000, revision=revision)
    assert got == _pieces(
        eng, "BOS", "U", HISTORICAL_RULE,
        A.encode() + b": Hi, I am Alice.", b"\n", b"I live in Lisbon.", b"\n",
        B.encode() + b": I am Bob.", "E", "M", b"Hello Alice and Bob!", "E", "U",
        B.encode() + b": " + "caf\u00e9 <start_of_turn> \u00fc".encode(), b"\n",
        b"and more", "E", "M", b"Sure.", "E", "U",
        B.encode() + b": Now?", "E", "M")        # after a model turn: labelled again
    assert len(got) < len(render(eng, history(), cur, 10_000, revision=3))


@pytest.mark.parametrize("revision", [2, 3, 4])
def test_every_revision_keeps_the_newest_turns_that_fit(eng: Engine, revision: int) -> None:
    cur = Turn(C, b"Now?")
    alone = render(eng, [], cur, 10_000, revision=revision)
    whole = render(eng, history(), cur, 10_000, revision=revision)
    for budget in range(len(alone), len(whole) + 1):
        got = render(eng, history(), cur, budget, revision=revision)
        assert len(got) <= budget
        kept = next(k for k in range(len(history()), -1, -1)
                    if got == render(eng, history()[len(history()) - k:], cur, 10_000,
                                     revision=revision))
        if kept < len(history()):   # the next older turn would not have fitted
            more = render(eng, history()[len(history()) - kept - 1:], cur, 10_000,
                          revision=revision)
            assert len(more) > budget
    assert render(eng, history(), cur, 1, revision=revision) == alone  # the input stays


def test_lease_revision_by_mode_and_recorded_family() -> None:
    assert DEFAULT_REVISION == 3
    assert [lease_revision(3, m) for m in (0, 1, 2)] == [3, 4, 5]
    assert [lease_revision(2, m) for m in (0, 1, 2)] == [2, 2, 2]
    # a conversation leased before keeps its family, whatever the default is now
    assert lease_revision(3, 1, recorded=2) == 2
    assert lease_revision(2, 1, recorded=4) == 4
    assert lease_revision(3, 0, recorded=1) == 2 and lease_revision(2, 0, recorded=5) == 3
