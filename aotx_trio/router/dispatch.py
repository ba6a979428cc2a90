"""Running one effective request on the runtime, and what the runtime said it ran.

The router reaches the runtime through the device client (in-process or the
service socket), typed here structurally as :class:`RuntimeLink` (the router
sits below the client in the layering):

* ``textgen``: the ``chat.generate`` stream (the same path as
  ``/v1/chat/completions``: the executor, its KV pool and admission order);
  ``prompt`` is raw text continued as is, ``messages`` use the chat template.
  Its open value carries the runtime's
  identity for the run, checked *before* any output is read.
* ``embedding``: the ``embed`` call; one float32 vector per text.

Runtime refusals keep their meaning in the seed's codes: a bad value is 422
``invalid_params`` (``param``, ``rule``), a full queue 429 ``over_capacity``; a
runtime that fails otherwise or drops mid-run is 502 ``upstream_failure``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aotx_trio import errors
from aotx_trio.router.attestation import mismatches

#: checks the runtime's identity for a run before its output is used (raises)
Check = Callable[[Mapping[str, Any]], None]


class RuntimeLink(Protocol):
    """What the router needs of a device client (aotx_trio.service.client.DeviceClient)."""

    async def call(self, method: str, params: dict[str, Any]) -> Any: ...

    def subscribe(self, method: str, params: dict[str, Any], *, buffer: int = ...,
                  ) -> contextlib.AbstractAsyncContextManager[Any]: ...


@dataclass(frozen=True)
class Caller:
    principal: str
    actions: tuple[str, ...]


def checker(want: Mapping[str, Any]) -> Check:
    """A :data:`Check` refusing (502 ``attestation_mismatch``) a run whose identity
    differs from ``want`` in any field."""
    def check(seen: Mapping[str, Any]) -> None:
        bad = mismatches(want, seen)
        if bad:
            raise errors.UpstreamFailure(
                "the runtime's identity disagrees with the release the router expects: "
                + ", ".join(m["field"] for m in bad), code="attestation_mismatch",
                mismatches=bad)
    return check


def _one(group: BaseExceptionGroup[Any]) -> errors.AotxError:
    """The error of a group whose leaves are all our errors (else the group again)."""
    leaves: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        exc = todo.pop()
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        else:
            leaves.append(exc)
    if leaves and all(isinstance(e, errors.AotxError) for e in leaves):
        first = leaves[-1]
        assert isinstance(first, errors.AotxError)
        return first
    raise group


def _runtime_error(exc: errors.AotxError) -> errors.AotxError:
    """A runtime refusal in the seed's codes (never a fallback: the error is final)."""
    if isinstance(exc, errors.InvalidInput):
        return errors.InvalidInput(exc.message, code="invalid_params",
                                   param=str(exc.fields.get("field") or "request"),
                                   rule=exc.code)
    if isinstance(exc, errors.OverCapacity | errors.JournalHold):
        return errors.OverCapacity(exc.message, retry_after=exc.fields.get("retry_after", 1))
    if isinstance(exc, errors.Forbidden):
        return exc
    return errors.UpstreamFailure(f"the runtime failed: {exc.message}",
                                  code="upstream_failure", runtime_code=exc.code)


async def textgen(link: RuntimeLink, caller: Caller, model: str, request: Mapping[str, Any],
                  check: Check) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(results, the runtime's identity) of a text generation."""
    text: dict[str, Any] = {"prompt": request["prompt"]} if request.get("prompt") is not None \
        else {"messages": [dict(m) for m in request.get("messages") or []]}
    params = {"principal": caller.principal, "actions": list(caller.actions), "model": model,
              **text, "max_tokens": request.get("max_tokens"),
              "temperature": request.get("temperature"), "top_p": request.get("top_p"),
              "seed": request.get("seed"), "stop": list(request.get("stop") or [])}
    parts: list[str] = []
    final: dict[str, Any] = {}
    refused: errors.UpstreamFailure | None = None
    try:
        async with link.subscribe("chat.generate", params) as sub:
            seen = dict(sub.opened.get("identity") or {})
            try:
                check(seen)
            except errors.UpstreamFailure as exc:
                refused = exc       # leaving the block cancels the generation
            else:
                async for item in sub:
                    if "text" in item:
                        parts.append(item["text"])
                    else:
                        final = item
    except BaseExceptionGroup as group:     # the in-process transport's nursery
        raise _runtime_error(_one(group)) from group
    except errors.AotxError as exc:
        raise _runtime_error(exc) from exc
    if refused is not None:
        raise refused
    if not final:
        raise errors.UpstreamFailure("the runtime ended the generation without a result",
                                     code="upstream_failure")
    usage = final.get("usage") or {}
    return [{"text": "".join(parts), "finish_reason": final.get("finish_reason", "stop"),
             "prompt_tokens": int(usage.get("prompt_tokens", 0)),
             "completion_tokens": int(usage.get("completion_tokens", 0))}], seen


async def embedding(link: RuntimeLink, caller: Caller, model: str,
                    request: Mapping[str, Any], check: Check,
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(results, the runtime's identity): one ``{"embedding": bytes, "dimension"}``
    per text, in order (``embedding`` is the binary field, float32 little-endian)."""
    params = {"principal": caller.principal, "actions": list(caller.actions), "model": model,
              "texts": list(request.get("texts") or [])}
    try:
        out = await link.call("embed", params)
    except errors.AotxError as exc:
        raise _runtime_error(exc) from exc
    seen = dict(out.get("identity") or {})
    check(seen)
    rows = out.get("vectors_b64") or []
    if len(rows) != len(params["texts"]):
        raise errors.UpstreamFailure("the runtime returned another number of vectors",
                                     code="upstream_failure")
    return [{"embedding": base64.b64decode(v), "dimension": int(out["dim"])}
            for v in rows], seen


DISPATCH = {"textgen": textgen, "embedding": embedding}
