"""A conversation's context as model tokens.

The context of an input is the conversation's history in input order (every
participant's inputs, labelled with the participant's principal name, and the
model's outputs) followed by the input itself and the model's turn marker.
Caller text is tokenized with special tokens OFF, so no participant can
inject a turn marker or any other control token; only the markers this
module adds are control tokens.  When the whole history does not fit the
model's context, the oldest turns are left out first (the current input is
always kept).

Gemma models get their chat markers (``<start_of_turn>user`` ...); other
architectures get the same layout as plain text.
"""

from __future__ import annotations

from dataclasses import dataclass

from aotx_trio.engine import Engine


@dataclass(eq=False)
class Turn:
    """One input of a conversation and, once it ran, the model's output.  Compared by
    identity: two equal inputs of one conversation are two turns."""

    label: str                  # the participant's principal name
    text: bytes
    output: bytes | None = None


def _markers(engine: Engine) -> tuple[list[int], list[int], list[int]]:
    """(user turn start, turn end, model turn start) as tokens."""
    def special(text: str) -> list[int]:
        return engine.tokenize(text, add_bos=False, parse_special=True)

    return (special("<start_of_turn>user\n"), special("<end_of_turn>\n"),
            special("<start_of_turn>model\n"))


def _plain(engine: Engine, data: bytes) -> list[int]:
    return engine.tokenize(data, add_bos=False, parse_special=False) if data else []


def render(engine: Engine, history: list[Turn], current: Turn, budget: int,
           memory: bytes = b"") -> list[int]:
    """The tokens of ``current``'s context within ``budget`` tokens (prompt only: the
    caller keeps room for the output).  ``memory`` (recalled memory, runtime/memory.py)
    opens the current user turn, as caller text."""
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


def render_chat(engine: Engine, messages: list[tuple[str, bytes]]) -> list[int]:
    """OpenAI-style messages (role, content) as tokens, ending with the model's turn
    marker.  ``system`` (and ``developer``) content opens the first user turn (Gemma
    has no system turn); ``assistant`` turns are the model's.  Content is tokenized
    with special tokens off, like shared inputs."""
    user, end, model = _markers(engine)
    bos = [engine.info.bos_id] if engine.info.bos_id >= 0 else []
    system = b"\n\n".join(c for r, c in messages if r in ("system", "developer"))
    tokens = list(bos)
    pending = system + b"\n\n" if system else b""
    for role, content in messages:
        if role in ("system", "developer"):
            continue
        if role == "assistant":
            tokens += model + _plain(engine, content) + end
        else:
            tokens += user + _plain(engine, pending + content) + end
            pending = b""
    if pending:                                     # only a system message
        tokens += user + _plain(engine, pending.rstrip()) + end
    return tokens + model
