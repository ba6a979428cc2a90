"""aotx_trio/native/engine.py and engine_cli.py on small synthetic models."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import synth_gguf as sg

from aotx_trio import errors
from aotx_trio.engine_cli import generate_main
from aotx_trio.native.engine import PAGE_TOKENS, Engine


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sg.write_model(tmp_path_factory.mktemp("m") / "g.gguf", sg.Spec())


@pytest.fixture
def eng(model: Path) -> Engine:
    return Engine.load(model, threads=2, max_seqs=4)


def test_info_and_tokenizer(eng: Engine) -> None:
    assert eng.info.arch == "gemma3" and eng.info.n_vocab == 512 and eng.info.window == 8
    assert eng.info.eot_id > 0 and eng.stop_ids == {1, eng.info.eot_id}
    ids = eng.tokenize("the capital of France is Paris")
    assert ids[0] == 2
    assert eng.tokenize("the capital", add_bos=False)[0] != 2
    assert eng.detokenize(ids[1:]) == b"the capital of France is Paris"
    assert eng.detokenize(eng.tokenize("\u00e9t\u00e9 \U0001F600", add_bos=False)) == \
        "\u00e9t\u00e9 \U0001F600".encode()


def test_greedy_generation_is_deterministic(eng: Engine) -> None:
    first = list(eng.generate("the capital of France", max_tokens=12))
    rec = eng.last
    assert b"".join(first) == rec.text == eng.detokenize(rec.tokens)
    assert len(rec.tokens) == 12 and rec.stop_reason == "length"
    assert rec.prompt_tokens == eng.tokenize("the capital of France")
    second = b"".join(eng.generate("the capital of France", max_tokens=12))
    assert second == rec.text
    assert rec.stats.prefill_tok_s > 0 and rec.stats.decode_tok_s > 0
    assert eng.kv_stats().used_pages == 0        # the sequence was released


def test_seeded_sampling(eng: Engine) -> None:
    def run(seed: int) -> list[int]:
        b"".join(eng.generate("the city", max_tokens=16, temperature=1.0, top_p=0.95, seed=seed))
        return eng.last.tokens

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_prefill_longer_than_a_step(model: Path) -> None:
    with Engine.load(model, threads=2, max_batch_tokens=16) as small, \
            Engine.load(model, threads=2) as big:
        prompt = "the capital of France is Paris and " * 6
        a = b"".join(small.generate(prompt, max_tokens=5))
        b = b"".join(big.generate(prompt, max_tokens=5))
        assert len(small.last.prompt_tokens) > 16
        assert a == b


def test_stops_at_eos(tmp_path: Path) -> None:
    path = sg.write_model(tmp_path / "eos.gguf", sg.Spec(eos_id=0, zero_output_norm=True))
    with Engine.load(path, threads=1) as e:
        assert b"".join(e.generate("the", max_tokens=10)) == b""
        assert e.last.tokens == [] and e.last.stop_reason == "stop"


def test_batched_api_accounting(eng: Engine) -> None:
    a, b = eng.add_sequence(), eng.add_sequence(seed=3)
    eng.reserve(a, 40)
    assert eng.kv_stats().page_tokens == PAGE_TOKENS == 8      # the default page size
    assert eng.kv_stats().reserved_pages == eng.pages_needed(0, 40) == 6 * 5   # 6 groups
    r = eng.step([(a, eng.tokenize("the capital of France")), (b, [2, 300])])
    ta = eng.sample(a, r, 0)
    tb = eng.sample(b, r, 1, temperature=0.8, top_p=0.9)
    assert 0 <= ta < 512 and 0 <= tb < 512
    st = eng.kv_stats()
    assert st.n_seqs == 2 and st.tokens_held == a.length + b.length
    assert st.slots_held - st.slots_live < 2 * st.n_groups * st.page_tokens
    eng.release(a)
    eng.release(b)
    eng.release(b)   # idempotent
    st = eng.kv_stats()
    assert st.used_pages == 0 and st.reserved_pages == 0


def test_bad_model_path() -> None:
    with pytest.raises(errors.AotxError, match="cannot open"):
        Engine.load("/nonexistent/model.gguf")


def test_cli_json(model: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    ns = argparse.Namespace(model=str(model), prompt="the capital of", max_tokens=6,
                            temperature=0.0, top_p=1.0, seed=0, threads=1, json=True)
    assert generate_main(ns) == 0
    doc = json.loads(capsysbinary.readouterr().out)
    assert set(doc) == {"prompt_tokens", "tokens", "text", "prefill_tok_s", "decode_tok_s"}
    assert doc["prompt_tokens"][0] == 2 and len(doc["tokens"]) == 6
    ns.json = False
    assert generate_main(ns) == 0
    out = capsysbinary.readouterr().out
    assert out[:-1].decode("utf-8", errors="replace") == doc["text"]   # text + newline
