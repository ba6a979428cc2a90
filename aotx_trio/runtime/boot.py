"""``aotx boot``: the runtime process (one nursery tree).

::

    run_runtime            opens the runtime file and the grant file (fail closed),
    │                      loads its text models (mapped in place), recovers the
    │                      device from the journal
    ├─ tick emitter        writes + fsyncs journal records, acknowledges saves
    ├─ executor            runs saved inputs on the models (runtime/executor.py)
    └─ service socket      <journal>/service.sock (docs/formats/socket.md)

:func:`run_runtime` reports its :class:`~aotx_trio.runtime.handler.ServiceHandler`
through ``task_status.started()`` once every child is ready, so ``aotx
serve`` can put the gateway (with an in-process client) in the same
``trio.run``.  SIGINT/SIGTERM cancel the tree; the service socket file is
removed and the journal closed on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import trio

from aotx_trio import _latency, errors
from aotx_trio._fs import flock_nb
from aotx_trio._process import on_reload, on_signal, run_trio, setup_logging
from aotx_trio.config import DEFAULT_DEADLINE_S, Limits
from aotx_trio.grants import load_grants
from aotx_trio.native import lib as native
from aotx_trio.native.device import Device
from aotx_trio.native.journal import JournalParams
from aotx_trio.runtime import checkpoint, faults
from aotx_trio.runtime.ccir import RuntimeFile
from aotx_trio.runtime.emitter import Emitter
from aotx_trio.runtime.executor import Executor
from aotx_trio.runtime.fanout import Fanout
from aotx_trio.runtime.handler import ServiceHandler
from aotx_trio.runtime.journal_file import open_journal_file
from aotx_trio.runtime.media import MediaStore
from aotx_trio.runtime.served import ModelSet
from aotx_trio.runtime.services import Services
from aotx_trio.runtime.socket_server import SOCKET_NAME, serve_socket
from aotx_trio.runtime.state import RuntimeState

log = logging.getLogger("aotx.boot")


# --------------------------------------------------------------------------- runtime state


@dataclass(frozen=True)
class JournalLimits:
    """``limits.journal_max_bytes`` / ``limits.journal_min_free_bytes`` (docs/configuration.md)."""

    max_bytes: int = Limits().journal_max_bytes        # file cap: writes hold before it
    min_free_bytes: int = Limits().journal_min_free_bytes  # disk floor (0 = none)

    @classmethod
    def of(cls, limits: Limits, max_bytes: int | None = None,
           min_free_bytes: int | None = None) -> JournalLimits:
        """The configured limits, each overridden by a command-line flag that was given."""
        return cls(limits.journal_max_bytes if max_bytes is None else max_bytes,
                   limits.journal_min_free_bytes if min_free_bytes is None else min_free_bytes)


@contextlib.asynccontextmanager
async def open_runtime_state(lineage: bytes, journal_dir: Path,
                             limits: JournalLimits | None = None, *,
                             runtime_file: Path | None = None,
                             held_lock: int | None = None,
                             ) -> AsyncIterator[RuntimeState]:
    """Open (or create) the journal in ``journal_dir``, replay it into a fresh device
    (fail closed on damage), queue this boot's transfer, and yield the state; closes
    the device and the file on exit.

    With ``runtime_file``: recovery starts from the file's checkpoint (when it has one;
    refused with ``checkpoint_damaged`` / ``checkpoint_mismatch`` when it does not fit
    this journal) and replays only the journal after it; on the way out (a clean stop,
    SIGTERM/SIGINT included) the journal is flushed and a new checkpoint written.
    ``held_lock``: the caller holds the folder's lock already (``open_journal_file``)."""
    limits = limits or JournalLimits()
    journal_dir.mkdir(parents=True, exist_ok=True)
    section = info = None
    if runtime_file is not None:
        section = await trio.to_thread.run_sync(checkpoint.read_section, runtime_file)
        info = checkpoint.parse_section(section) if section is not None else None
    position = checkpoint.journal_position(info, lineage, str(journal_dir)) \
        if info is not None else None
    jf = await trio.to_thread.run_sync(
        functools.partial(open_journal_file, journal_dir, lineage, resume=False,
                          params=JournalParams(file_cap_bytes=limits.max_bytes),
                          ops=faults.from_env(), position=position, held_lock=held_lock))
    if isinstance(jf.ops, faults.FaultyFileOps):
        jf.ops.armed = True      # open and recovery ran on real I/O
        log.warning("journal %s: %s is set: injecting write faults", jf.path, faults.ENV)
    device = None
    recovered = False
    try:
        device = Device(jf.journal, lineage.hex())
        if jf.start is not None and section is not None:
            device.load_checkpoint(section)   # verifies it whole; the reader seeks past it
        reader = jf.replay_reader(lineage)
        device.recover(reader)   # replays, resumes the journal, marks interrupted inputs
        try:
            jf.journal.begin_boot()
        except errors.JournalHold:   # at the cap: serve reads; the boot rides the next write
            log.warning("journal %s: at its cap of %d bytes: writes hold", jf.path,
                        limits.max_bytes)
        emitter = Emitter.for_file(jf, min_free_bytes=limits.min_free_bytes)
        emitter.wake()
        log.info("journal %s: %d transfers replayed (from record %d), %d torn bytes dropped",
                 jf.path, len(jf.transfers), jf.start.records if jf.start else 0,
                 jf.truncated_bytes)
        recovered = True
        yield RuntimeState(device, jf, emitter, lineage.hex())
    finally:
        if device is not None:
            if runtime_file is not None and recovered:
                _checkpoint_on_exit(device, emitter, runtime_file)
            device.close()
        jf.close()


def _checkpoint_on_exit(device: Device, emitter: Emitter, runtime_file: Path) -> None:
    """The shutdown checkpoint; a failure is logged, never raised over the exit's cause
    (the journal holds everything: the next boot replays more)."""
    try:
        checkpoint.save_on_shutdown(device, emitter, runtime_file)
    except (OSError, errors.AotxError) as exc:
        log.warning("checkpoint not written to %s: %s", runtime_file, exc)


def load_runtime_file(ccir_path: Path) -> RuntimeFile:
    """A complete runtime file with the shared profile."""
    rf = RuntimeFile.open(ccir_path)
    if not rf.shared:
        raise errors.UnsupportedProfile(
            f"{ccir_path} lacks the shared profile (run: aotx pack --runtime {ccir_path} "
            "--shared)", code="shared_profile_missing", field="ccir")
    return rf


async def run_runtime(ccir: str | Path, journal: str | Path, grants_dir: str | Path, *,
                      socket: bool = True, execution_deadline_s: float = DEFAULT_DEADLINE_S,
                      journal_limits: JournalLimits | None = None,
                      journal_lock: int | None = None,
                      task_status: trio.TaskStatus[ServiceHandler] = trio.TASK_STATUS_IGNORED,
                      ) -> None:
    """The runtime nursery: emitter, executor and service socket; ``started()`` with the
    handler once the models are loaded and every child is ready.  ``journal_lock``:
    the journal folder's lock, taken by the caller (``aotx serve``) before it wrote
    anything (``journal_file.journal_dir_locked``)."""
    with runtime_file_lock(Path(ccir)):   # aotx pack refuses while it is held
        rf = load_runtime_file(Path(ccir))
        grants = load_grants(grants_dir)  # serves nothing without deployment grants
        journal_dir = Path(journal)
        models = await trio.to_thread.run_sync(functools.partial(
            ModelSet.load, rf, embedding_root=journal_dir / "models"))
        try:
            async with open_runtime_state(rf.header.lineage, journal_dir, journal_limits,
                                          runtime_file=Path(ccir),
                                          held_lock=journal_lock) as state:
                executor = Executor(state.device, state.emitter,
                                    native.capacities()["result_bytes"],
                                    deadline_s=execution_deadline_s)
                fanout = Fanout(state.device, state.emitter, state.lineage)
                media = MediaStore(journal_dir / "media",   # under the journal's disk floor
                                   min_free_bytes=state.emitter.min_free_bytes)
                handler = ServiceHandler(Services.booted(
                    state, models, executor, media, fanout), grants)
                async with trio.open_nursery() as nursery:
                    await nursery.start(state.emitter.run)
                    await nursery.start(executor.run)
                    await nursery.start(fanout.run)
                    if socket:
                        await nursery.start(serve_socket, journal_dir / SOCKET_NAME, handler)
                    task_status.started(handler)
        finally:
            models.close()


@contextlib.contextmanager
def runtime_file_lock(ccir: Path) -> Iterator[None]:
    """A shared ``flock`` on the runtime file for as long as the runtime runs."""
    fd = flock_nb(ccir, shared=True) if ccir.is_file() else -1
    if fd is None:
        raise errors.ConfigError(f"{ccir} is being rewritten by aotx pack; try again when it "
                                 "is done", code="runtime_in_use", field="ccir")
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


async def _boot(args: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_signal, nursery.cancel_scope.cancel)
        limits = JournalLimits.of(Limits(), args.journal_max_bytes, args.journal_min_free_bytes)
        handler = await nursery.start(functools.partial(
            run_runtime, args.ccir, args.journal, args.service_grants,
            execution_deadline_s=args.execution_deadline_s, journal_limits=limits))
        sock = Path(args.journal) / SOCKET_NAME

        def reload() -> None:   # SIGHUP: the deployment grants, without a restart
            handler.grants = load_grants(args.service_grants)

        await nursery.start(on_reload, reload)
        _latency.tune_gc()   # serving: the start-up heap out of every collection's walk
        print(f"aotx boot: lineage {handler.lineage}, serving {sock}", flush=True)


def main(args: argparse.Namespace) -> int:
    setup_logging()
    run_trio(_boot, args)
    print("aotx boot: stopped", flush=True)
    return 0
