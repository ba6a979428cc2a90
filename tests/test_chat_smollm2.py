"""The default chat model, SmolLM2-135M-Instruct (Q4_1, its GGUF's own ChatML template),
answers through /v1/chat/completions on a real server, and its template renders as the
template's text tokenized whole would (the markers change nothing for plain text)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import trio
from _gateway_env import ALL, served, token_for

from aotx_trio.default_models import default_chat_model
from aotx_trio.native.engine import Engine
from aotx_trio.runtime import pack
from aotx_trio.runtime.prompt import render_chat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_template_turns_and_stops() -> None:
    with Engine.load(default_chat_model(), max_seqs=1) as eng:
        assert eng.chat_template is not None and eng.turns is not None
        im_end = eng.tokenize("<|im_end|>", add_bos=False, parse_special=True)
        assert eng.turns.end_of_turn == set(im_end) and set(im_end) <= eng.stop_ids
        messages = [("system", b"Be brief."), ("user", b"What is 2+2?"),
                    ("assistant", b"4"), ("user", b"And 3+3?")]
        text = eng.chat_template.render([{"role": r, "content": c.decode()}
                                         for r, c in messages])
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
        assert text.endswith("<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")
        assert render_chat(eng, messages) == eng.tokenize(text, add_bos=False,
                                                          parse_special=True)


async def test_answers_through_v1_on_a_real_server(tmp_path: Path) -> None:
    folder = tmp_path / "rt"
    emb = folder / "embedding"          # a stub: not loaded (the text model is the point)
    emb.mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("tokenizer.json", b"{}"),
                       ("model.safetensors", bytes(16))):
        (emb / name).write_bytes(data)
    ccir = folder / "runtime.aotxccir"
    pack.pack(ccir, models=[default_chat_model()], embedding=emb, shared=True,
              lineage="0123456789abcdef0123456789abcdef", progress=False)
    async with served(tmp_path, {"alice": (*ALL, "models_invoke")}, ccir=ccir) as srv:
        def run() -> object:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key=token_for("alice"),
                              max_retries=0, timeout=120)
            return c.chat.completions.create(model=NAME, max_tokens=32, messages=[
                {"role": "user", "content": "What is the capital of France? "
                                            "Answer in one sentence."}])

        done = await trio.to_thread.run_sync(run)
    choice = done.choices[0]                                      # type: ignore[attr-defined]
    assert choice.message.content == "The capital of France is Paris."
    assert choice.finish_reason == "stop"                # at <|im_end|>, not the limit
    assert done.usage.completion_tokens == 7                      # type: ignore[attr-defined]
