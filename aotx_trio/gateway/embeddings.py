"""OpenAI-compatible ``POST /v1/embeddings`` on the runtime's embedding model.

Bearer auth with the ``models_invoke`` action.  Accepted: ``model`` (the name
``GET /v1/models`` lists for the embedding model: ``embedding``), ``input`` (a
string or a list of 1..256 strings), ``encoding_format`` (``float``, the
default, or ``base64``: the little-endian float32 bytes, which the official
``openai`` client asks for and decodes itself), ``dimensions`` (only the
model's own) and ``user`` (ignored).  Token-id inputs and anything else are 400
naming the parameter; a text over the model's tokens (256 for MiniLM) is 400
``context_length_exceeded`` with ``param: "input.<i>"`` and the ``limit``, never
cut.  One runtime ``embed`` call runs every text (our C encoder, mean pooled and
L2-normalised); nothing persists.  Answer:
``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage": {"prompt_tokens", "total_tokens"}}``.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from quart import Response, request

from aotx_trio import errors
from aotx_trio.gateway.chat import EMBEDDING_ID, INVALID, UNSUPPORTED, refuse_unknown
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.gateway.shared_routes import client, principal
from aotx_trio.service.client import DeviceClient

KNOWN = {"model", "input", "encoding_format", "dimensions", "user"}
MAX_INPUTS = 256


def _texts(body: dict[str, Any]) -> list[str]:
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_INPUTS or \
            not all(isinstance(t, str) for t in texts):
        raise errors.InvalidParams("input", INVALID, "input must be a string or a list of "
                                   f"1..{MAX_INPUTS} strings (token ids are not supported)")
    return texts


async def _embedding_models(client: DeviceClient) -> set[str]:
    """The names the ready embedding model answers to: ``embedding`` (what
    ``GET /v1/models`` lists) and the name capabilities gives it."""
    caps = await client.capabilities()
    names = {str(m["name"]) for m in caps.get("models", [])
             if m.get("kind") == "embedding" and m.get("ready")}
    return names | {EMBEDDING_ID} if names else set()


async def create_embeddings() -> Response:
    p = principal()
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    body = refuse_unknown(decode_json(raw), KNOWN, {})
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise errors.InvalidParams("model", INVALID, "model must be a string")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise errors.InvalidParams("encoding_format", INVALID,
                                   "encoding_format must be float or base64")
    texts = _texts(body)
    known = await _embedding_models(client())
    if model not in known:
        raise errors.NotFound(f"no embedding model {model!r}", code="model_not_found")
    try:
        out = await client().call("embed", {"principal": p.name,
                                            "actions": list(p.actions),
                                            "model": model, "texts": texts,
                                            "truncate": False})
    except errors.InvalidInput as exc:   # the runtime's ``texts[i]`` is OpenAI's input
        field = str(exc.fields.get("field") or "")
        param = field.replace("texts", "input", 1) if field.startswith("texts") else field
        raise errors.InvalidParams(param, exc.code, exc.message,
                                   **{k: v for k, v in exc.fields.items()
                                      if k == "limit"}) from exc
    dim = int(out["dim"])
    dims = body.get("dimensions")
    if dims is not None and dims != dim:
        raise errors.InvalidParams("dimensions", UNSUPPORTED,
                                   f"dimensions must be {dim} (the model's own)")
    data = []
    for i, b64 in enumerate(out["vectors_b64"]):
        vec: Any = b64 if fmt == "base64" else \
            np.frombuffer(base64.b64decode(b64), "<f4").astype(float).tolist()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    tokens = sum(int(t) for t in out.get("tokens", []))
    return json_response({"object": "list", "data": data, "model": model,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, 200)


VIEWS = {"v1_embeddings": create_embeddings}
