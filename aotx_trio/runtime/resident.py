"""Conversations' KV pages kept resident between turns (prefix reuse).

When an input of a conversation ends, its engine sequence is not freed: it
stays here, with the tokens its KV cache holds, as the conversation's
*resident* sequence (one per conversation, least recently used first).  The
conversation's next input forks it: the new sequence shares the whole pages
of the longest common token prefix of the resident tokens and its own prompt
(the prompt is always rendered afresh from the device's history, so reuse is
only ever a cache: a prefix that no longer matches is simply recomputed), and
prefill starts after the shared positions.  Reuse is by conversation
identity, never by hashing text.

Resident sequences hold pages and sequence slots nobody is using, so they
give way first: whenever a sequence or its reservation does not fit, the
least recently used resident sequence of that engine is freed and the
attempt repeated (:meth:`ResidentCache.make_room`); an input only waits for
pages once no resident sequence is left to free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from aotx_trio.native.engine import Engine, EngineSequence


@dataclass(eq=False)
class Resident:
    engine: Engine
    seq: EngineSequence
    tokens: list[int]           # what its KV cache holds, position by position


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ResidentCache:
    def __init__(self) -> None:
        self._by_conversation: OrderedDict[str, Resident] = OrderedDict()
        self.reused_tokens = 0      # prompt positions taken from resident pages
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._by_conversation)

    def keep(self, conversation: str, engine: Engine, seq: EngineSequence,
             tokens: Sequence[int]) -> None:
        """``seq`` (holding ``tokens``) becomes the conversation's resident sequence."""
        old = self._by_conversation.pop(conversation, None)
        if old is not None:
            old.engine.release(old.seq)
        held = list(tokens[:seq.length])
        if not held:
            engine.release(seq)
            return
        self._by_conversation[conversation] = Resident(engine, seq, held)

    def get(self, conversation: str, engine: Engine) -> Resident | None:
        res = self._by_conversation.get(conversation)
        if res is not None and res.engine is not engine:   # another model: useless
            self.drop(conversation)
            return None
        return res

    def drop(self, conversation: str) -> None:
        res = self._by_conversation.pop(conversation, None)
        if res is not None:
            res.engine.release(res.seq)

    def make_room(self, engine: Engine, spare: Resident | None = None) -> bool:
        """Free the least recently used resident sequence of ``engine`` (``spare``
        last); False when there is none left."""
        victim = next((c for c, r in self._by_conversation.items()
                       if r.engine is engine and r is not spare), None)
        if victim is None and spare is not None and spare in self._by_conversation.values():
            victim = next(c for c, r in self._by_conversation.items() if r is spare)
        if victim is None:
            return False
        self.drop(victim)
        self.evictions += 1
        return True

    def clear(self) -> None:
        for conversation in list(self._by_conversation):
            self.drop(conversation)
