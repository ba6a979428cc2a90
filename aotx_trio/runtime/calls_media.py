"""Media: ``media.put`` stores a caller's upload (runtime/media.py), and the check of
an input's media rows against the actor's uploads."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from aotx_trio import errors, vocab
from aotx_trio.runtime import render, validate
from aotx_trio.runtime.callers import Callers
from aotx_trio.runtime.media import MediaStore
from aotx_trio.runtime.quota import media_quota
from aotx_trio.runtime.served import TextModel
from aotx_trio.runtime.services import Method, Services


class MediaCalls:
    def __init__(self, services: Services, callers: Callers) -> None:
        self.media = services.media
        self.save_state = services.save_state
        self.callers = callers

    def methods(self) -> dict[str, Method]:
        return {"media.put": self.put}

    async def put(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``media.put``: store ``data`` (base64) as the caller's media; answers once it is
        durable (runtime/media.py)."""
        grants, key = self.callers.caller(params)
        if not grants & vocab.GRANT_WRITE:
            raise errors.Forbidden("uploading media needs the shared_write grant",
                                   reason="deployment_grant", action="shared_write")
        if self.media is None:
            raise errors.NotReady("this runtime stores no media", missing="media")
        held = render.hold_names(self.save_state())
        if held:   # like every write: nothing is stored while the journal holds
            raise errors.JournalHold(f"the journal holds writes ({', '.join(held)}); "
                                     "retry later", hold=held)
        try:
            data = base64.b64decode(str(params.get("data", "")), validate=True)
        except ValueError:
            raise errors.InvalidInput("data must be base64", field="data") from None
        if not data:
            raise errors.InvalidInput("an upload needs at least one byte", field="body")
        media, created = await media_quota(self.media).put(  # quotas.media_bytes
            self.callers.quota_limits(), key, str(params.get("content_type", "")), data)
        return {"media": {"type": media.type, "sha256": media.sha256,
                          "content_type": media.content_type, "bytes": media.bytes},
                "created": created}


def check_media(store: MediaStore | None, key: str, media: tuple[tuple[str, str], ...],
                model: TextModel) -> None:
    """An input's media rows: each one the actor's own upload of that type (else 404
    ``media_not_found``, whoever else uploaded it), then a model that takes them."""
    for i, (kind, sha) in enumerate(media):
        owned = None if store is None else store.owned(key, sha)
        if owned is None or owned.type != kind:
            raise errors.NotFound(f"no {kind} media {sha} uploaded by the caller",
                                  code="media_not_found", field=f"media[{i}]")
    if media:
        raise errors.InvalidInput(f"model {validate.shown(model.name)} takes text only",
                                  code="media_unsupported", field="media",
                                  model=model.name)
