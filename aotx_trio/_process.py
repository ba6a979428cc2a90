"""Process plumbing shared by every entry point (``aotx boot``, ``aotx gateway
serve``, ``aotx serve``): logging set-up, signals, and ``trio.run`` with our
own errors unwrapped.  A leaf: it imports nothing of ``runtime`` or
``gateway``, so the two process roles never import each other.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from aotx_trio import errors

log = logging.getLogger("aotx.process")

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def setup_logging(level: int = logging.INFO) -> None:
    """Log lines to stderr, one format for every process."""
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)


async def on_signal(action: Callable[[], object], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Call ``action`` on the first SIGINT or SIGTERM, then return (a later signal
    gets Python's default handling back once this task has ended)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
            action()
            return


async def on_reload(action: Callable[[], object], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Call ``action`` on every SIGHUP (reload credentials and grants), for the life of
    the task; an error of ours in it is logged and the old state kept."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            log.info("signal SIGHUP: reloading")
            try:
                action()
            except errors.AotxError as exc:
                log.error("reload refused, keeping the running configuration: %s", exc)


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside ``exc`` (itself when it is no group)."""
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from leaves(sub)
    else:
        yield exc


def run_trio(fn: Callable[..., Awaitable[None]], *args: Any) -> None:
    """``trio.run`` for an entry point: when the tree died of our own errors only, raise
    the first one unwrapped so the CLI prints its code and message (exit status 1)."""
    try:
        trio.run(fn, *args)
    except BaseExceptionGroup as group:
        found = list(leaves(group))
        ours = [e for e in found if isinstance(e, errors.AotxError)]
        if ours and len(ours) == len(found):
            raise ours[0] from group
        raise
