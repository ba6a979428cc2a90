"""One input (or an ephemeral chat/memory call) the executor runs: its own module so
that runtime/memory.py can make and read jobs without importing the executor (which
imports it)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aotx_trio.native.engine import EngineSequence
from aotx_trio.runtime.prompt import DEFAULT_REVISION, Turn
from aotx_trio.runtime.served import TextModel

__all__ = ["Job"]


@dataclass(eq=False)
class Job:
    """One saved input admission to run."""

    op_id: str
    conversation: str
    model: TextModel
    turn: Turn
    max_output: int
    temperature: float = 0.0
    top_p: float = 1.0
    prompt: list[int] = field(default_factory=list)
    fed: int = 0                                  # prompt tokens fed so far
    seq: EngineSequence | None = None
    next_token: int | None = None                 # sampled, not yet fed
    out_tokens: list[int] = field(default_factory=list)
    out: bytearray = field(default_factory=bytearray)
    cancelled: bool = False                       # asked to stop: ends at the next step
    deadline: float = math.inf                    # clock time it must be done by
    started: float = 0.0                          # clock time it joined a group
    ephemeral: bool = False     # not a device operation (chat completions): the prompt
                                # is given, nothing is journaled, :meth:`Executor.ended`
    stop: tuple[bytes, ...] = ()                  # stop sequences (not part of the output)
    seed: int | None = None                       # sampling seed (default: from op_id)
    finish: str | None = None   # stop | length | cancelled | deadline_exceeded | error
    abandoned: bool = False     # ephemeral, and nobody waits for its end any more
    input_index: int = 0        # its place in the conversation's input order (device)
    tried_at: int = -1          # Executor.completed when it last failed to join
    actor: str = ""             # its participant's key
    query: Any = None           # its retained embedding: the recall query (runtime/memory.py)
    # the shared memory retention mode of the input (memory.py hand_over): recorded in its
    # lease row, then its retention uses it; 0 = it retains nothing
    retention_mode: int = 0
    # its memory processing (retention, mode 2's memory calls): run once in the executor's
    # nursery right after its lease is applied, then the job queues to join a group
    # (memory.MemoryService.hand_over)
    prepare: Callable[[Job], Awaitable[None]] | None = None
    leased: bool = False        # its execution lease is applied (device jobs run only then)
    revision: int = DEFAULT_REVISION   # the lease revision its context is rendered with
    journaled: int = 0          # output bytes journaled as OUTPUT transfers
