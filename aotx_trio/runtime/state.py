"""What a booted runtime holds (a leaf of ``runtime/``: boot fills it, tools read it)."""

from __future__ import annotations

from dataclasses import dataclass

from aotx_trio.native.device import Device
from aotx_trio.runtime.emitter import Emitter
from aotx_trio.runtime.journal_file import JournalFile


@dataclass
class RuntimeState:
    """The device, the journal file it writes through, and the tick emitter."""

    device: Device
    journal_file: JournalFile
    emitter: Emitter
    lineage: str
