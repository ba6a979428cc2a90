"""The loaded models, for the serving router: ``identity``, ``embed``, ``model.load``
and the ``chat.generate`` stream (nothing here persists)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio.identity import build_commit, descriptor_sha256
from aotx_trio.runtime import validate
from aotx_trio.runtime.callers import Callers
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.prompt import Turn, render_chat
from aotx_trio.runtime.services import Method, Services, StreamMethod

EMBED_QUEUE = 64        # embed calls waiting for the encoder; one more is over_capacity
MAX_LOADED_ON_DEMAND = 4   # GGUF models model.load may add


class ModelCalls:
    """``embed_limiter``: one encoder run at a time, all callers (memory included)."""

    def __init__(self, services: Services, callers: Callers,
                 embed_limiter: trio.CapacityLimiter, load_lock: trio.Lock) -> None:
        self.services = services
        self.callers = callers
        self.embed_limiter = embed_limiter
        self.load_lock = load_lock

    def methods(self) -> dict[str, Method]:
        return {"identity": self.identity, "embed": self.embed,
                "model.load": self.load_model}

    def streams(self) -> dict[str, StreamMethod]:
        return {"chat.generate": self.chat}

    async def identity(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Who this runtime is, for the router's attestation check: the build commit,
        the engine sets it has (none on CPU), every loaded artifact and descriptor."""
        return {"runtime_id": self.services.lineage, "source_commit": build_commit(),
                "gpu": None, "engine_sets": [], "artifacts": self.services.models.identity()}

    @staticmethod
    def _ran(artifact_sha256: str, descriptor: Mapping[str, Any]) -> dict[str, Any]:
        return {"source_commit": build_commit(), "artifact_sha256": artifact_sha256,
                "descriptor_sha256": descriptor_sha256(descriptor), "gpu": None}

    async def embed(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``embed``: one float32 vector (little-endian, base64) per text, in order.
        A text over the model's tokens is cut to them, or with ``"truncate": false``
        refused (400 ``context_length_exceeded`` naming ``texts.<i>`` and the limit)."""
        self.callers.require_invoke(params)
        texts = validate.embed_texts(params)
        truncate = params.get("truncate", True)
        if not isinstance(truncate, bool):
            raise errors.InvalidInput("truncate must be a boolean", field="truncate")
        model = self.services.models.embedding
        if model is None:
            raise errors.InvalidInput("this runtime has no embedding model",
                                      code="unknown_model", field="model")
        embedder = model.get()
        if not truncate:
            limit = embedder.max_len      # word pieces with [CLS] and [SEP]
            for i, text in enumerate(texts):
                # one piece past what fits is enough to know (no whole-text tokenizing)
                if len(embedder.tokenizer.pieces(text, limit - 1)) + 2 > limit:
                    raise errors.InvalidInput(
                        f"texts.{i} is over the {limit} tokens of the embedding model "
                        f"{model.name!r}", code="context_length_exceeded",
                        field=f"texts.{i}", limit=limit)
        if self.embed_limiter.statistics().tasks_waiting >= EMBED_QUEUE:
            raise errors.OverCapacity("the embedding queue is full", retry_after=1)
        tokens = [len(embedder.tokenize(t)) for t in texts]
        vectors = await trio.to_thread.run_sync(embedder.embed, texts,
                                                limiter=self.embed_limiter)
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
        return {"model": model.name, "dim": embedder.dim, "vectors_b64": rows,
                "tokens": tokens, "identity": self._ran(model.artifact_sha256,
                                                        model.descriptor)}

    async def load_model(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``model.load``: load a GGUF file (the router exported it from its store) for a
        release or scratch revision this runtime has not loaded; its identity row."""
        self.callers.require_invoke(params)
        path, sha, descriptor = validate.model_load(params)
        models = self.services.models
        async with self.load_lock:
            for row in models.identity():
                if row["artifact_sha256"] == sha and row["kind"] == "textgen" and (
                        descriptor is None
                        or row["descriptor_sha256"] == descriptor_sha256(descriptor)):
                    return row
            loaded = [m for m in models if m.name.startswith("artifact-")]
            if len(loaded) >= MAX_LOADED_ON_DEMAND:
                raise errors.OverCapacity(f"{len(loaded)} models are loaded on demand (the "
                                          "limit)", retry_after=60)
            # one name per artifact; another descriptor of it gets the descriptor's digest
            name = f"artifact-{sha[:16]}"
            if name in models.text:
                name = f"{name}-{descriptor_sha256(descriptor or {})[:16]}"
            model = await trio.to_thread.run_sync(models.load_gguf, path, sha, descriptor,
                                                  name)
            models.text[model.name] = model
        return next(r for r in models.identity() if r["name"] == model.name)

    async def chat(self, params: Mapping[str, Any],
                   ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``chat.generate``: an ordinary (nothing persists) chat completion on a loaded
        text model, through the same executor, KV pool and admission order as shared
        inputs (``prompt`` instead of ``messages``: raw text continued as is).  Opens
        with ``{"model", "id", "prompt_tokens", "identity"}``; pushes ``{"text"}``
        pieces (never a part of a stop sequence); ends with one ``{"finish_reason",
        "usage"}``.  Leaving the stream early cancels the generation."""
        self.callers.require_invoke(params)
        executor = self.services.executor
        if executor is None:
            raise errors.RuntimeUnavailable("this runtime runs no models")
        req = validate.chat_request(params)
        model = self.services.models.get(req.model)
        prompt = render_chat(model.engine, req.messages) if req.prompt is None else \
            model.engine.tokenize(req.prompt, add_bos=True, parse_special=False)
        max_out = req.max_tokens if req.max_tokens is not None \
            else max(1, model.context - len(prompt))
        if len(prompt) + max_out > model.context:
            # the field at fault: the prompt (or messages) when it alone fills the
            # context, else max_tokens
            source = "messages" if req.prompt is None else "prompt"
            raise errors.InvalidInput(
                f"{len(prompt)} prompt tokens + max_tokens {max_out} are over the context "
                f"of {req.model!r} ({model.context})", code="context_length_exceeded",
                field=source if len(prompt) >= model.context else "max_tokens")
        job_id = secrets.token_hex(16)
        job = Job(job_id, "", model, Turn("", b""), max_out, req.temperature, req.top_p,
                  prompt=prompt, ephemeral=True, stop=req.stop, seed=req.seed)
        try:
            executor.submit(job)
        except trio.WouldBlock:
            raise errors.OverCapacity("the runtime's admission queue is full",
                                      retry_after=1) from None
        hold = max((len(s) for s in req.stop), default=1) - 1

        async def items() -> AsyncIterator[dict[str, Any]]:
            sent = 0
            try:
                while True:
                    done = executor.ended(job_id)
                    data = bytes(job.out)
                    safe = len(data) if done is not None else max(sent, len(data) - hold)
                    if safe > sent:
                        yield {"text": data[sent:safe].decode("utf-8", errors="replace")}
                        sent = safe
                    if done is not None:
                        yield {"finish_reason": done.finish or "stop", "usage": {
                            "prompt_tokens": len(prompt),
                            "completion_tokens": len(done.out_tokens),
                            "total_tokens": len(prompt) + len(done.out_tokens)}}
                        return
                    await executor.wait_progress()
            finally:
                executor.abandon(job_id)    # if the caller left early: free its pages

        return {"model": req.model, "id": job_id, "prompt_tokens": len(prompt),
                "identity": self._ran(model.digest, model.descriptor)}, items()
