"""``POST /aotx/v1/shared/media``: raw image or audio bytes, stored content-addressed
and owned by the uploader (runtime/media.py), answered once durable.

The body limit of this one route is ``limits.max_media_bytes`` instead of
``max_body_bytes``: :func:`request_class` gives the app a Quart request class
that picks the limit by route when the request is made (Quart checks the
limit while the body arrives, and a declared ``Content-Length`` over it
before), so an over-limit upload is 413 ``body_too_large`` naming the media
limit, whichever of the two is larger.
"""

from __future__ import annotations

from typing import Any

from quart import Response, current_app, request
from quart_trio.wrappers import TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge

from aotx_trio import errors
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.routes_table import BASE
from aotx_trio.gateway.shared_routes import client, principal
from aotx_trio.vocab import MEDIA_TYPE_RULE, media_content_type

PATH = BASE + "/media"


def request_class(max_media_bytes: int) -> type[TrioRequest]:
    class _Request(TrioRequest):
        def __init__(self, method: str, scheme: str, path: str, *args: Any,
                     max_content_length: int | None = None, **kw: Any) -> None:
            if method == "POST" and path == PATH:
                max_content_length = max_media_bytes
            super().__init__(method, scheme, path, *args,
                             max_content_length=max_content_length, **kw)

    return _Request


async def upload() -> Response:
    """The view of ``media_upload`` (the admit step checked ``shared_write``)."""
    p = principal()
    content_type = request.headers.get("Content-Type", "")
    if media_content_type(content_type) is None:   # 422 before the body is read
        raise errors.InvalidInput(MEDIA_TYPE_RULE, code="media_type_invalid",
                                  field="Content-Type")
    limit = int(current_app.config["AOTX_MAX_MEDIA_BYTES"])
    try:
        data = await request.get_data(cache=False)
    except RequestEntityTooLarge:
        raise errors.BodyTooLarge(f"media over the limit of {limit} bytes",
                                  limit=limit) from None
    assert isinstance(data, bytes)
    out = await client().media_put(p.name, p.actions, content_type, data)
    return json_response(out["media"], 201 if out["created"] else 200)


VIEWS = {"media_upload": upload}

