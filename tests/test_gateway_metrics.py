"""GET /metrics: the Prometheus text format behind metrics_read, with the gateway's
HTTP counters (fast path included) and the runtime's numbers (KV pages, queue,
tokens, time to first token, journal)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from _gateway_env import ALL, TINY_MODEL, Env, embedded
from prometheus_client.parser import text_string_to_metric_families

from aotx_trio.gateway.metrics import route_template

pytestmark = pytest.mark.timeout(120)
BASE = "/aotx/v1/shared"
WATCHER = ("shared_read", "metrics_read")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def _scrape(env: Env, who: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = await env.client.get("/metrics", headers=env.auth(who))
    assert resp.status_code == 200, await resp.get_data(as_text=True)
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return _samples(await resp.get_data(as_text=True))


async def test_metrics_need_the_metrics_read_action(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL, "watch": WATCHER}) as env:
        assert (await env.client.get("/metrics")).status_code == 401
        resp = await env.client.get("/metrics", headers=env.auth("alice"))
        assert resp.status_code == 403
        assert (await resp.get_json())["error"]["action"] == "metrics_read"
        await _scrape(env, "watch")


async def test_metrics_count_requests_and_the_runtime(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL, "watch": WATCHER}) as env:
        h = env.auth("alice")
        body = env.body
        assert (await env.client.post(BASE + "/participant", headers=h,
                                      json=body(1, 1))).status_code == 202
        space = (await (await env.client.post(BASE + "/spaces", headers=h,
                                              json=body(2, 2))).get_json())["resource"]
        con = (await (await env.client.post(f"{BASE}/spaces/{space}/conversations",
                                            headers=h, json=body(3, 3))).get_json())["resource"]
        op = (await (await env.client.post(f"{BASE}/conversations/{con}/inputs", headers=h,
                                           json=body(4, 4, text="hi", model=TINY_MODEL,
                                                     max_output_tokens=5))).get_json())
        with trio.fail_after(30):
            while (await (await env.client.get(f"{BASE}/operations/{op['operation']}",
                                               headers=h)).get_json())["status"] != "succeeded":
                await trio.sleep(0.01)
        got = await _scrape(env, "watch")
    route = ("route", f"{BASE}/conversations/{{conversation}}/inputs")
    assert got[("aotx_http_requests_total",
                (("method", "POST"), route, ("status", "202")))] == 1
    assert got[("aotx_kv_pages", (("model", TINY_MODEL), ("state", "total")))] > 0
    # packed by `aotx pack`: f16 KV, 2 bytes per element (K and V, 2 layers x 8 x 1 x 32)
    assert got[("aotx_kv_page_bytes", (("model", TINY_MODEL),))] == 2 * 2 * 8 * 32 * 2
    pages = {s: got[("aotx_kv_pages", (("model", TINY_MODEL), ("state", s)))]
             for s in ("total", "free", "used")}
    # the conversation's pages stay resident for its next input
    assert pages["free"] + pages["used"] == pages["total"] and pages["used"] >= 1
    assert got[("aotx_resident_sequences", ())] == 1
    assert got[("aotx_engine_reused_tokens_total", ())] == 0
    assert got[("aotx_inputs_finished_total", (("status", "succeeded"),))] == 1
    assert 1 <= got[("aotx_engine_output_tokens_total", ())] <= 5
    assert got[("aotx_engine_prefill_tokens_total", ())] > 0
    assert got[("aotx_time_to_first_token_seconds_count", ())] == 1
    assert got[("aotx_admission_queue_depth", ())] == 0
    assert got[("aotx_journal_saved_records", ())] > 0
    # every saved tick is timed, and its fsync within it
    ticks = got[("aotx_journal_tick_seconds_count", ())]
    assert ticks >= 5 and got[("aotx_journal_fsync_seconds_count", ())] == ticks
    fsyncs = got[("aotx_journal_fsync_seconds_sum", ())]
    assert got[("aotx_journal_tick_seconds_sum", ())] >= fsyncs > 0


def test_route_templates_keep_labels_few() -> None:
    lin, h = "0" * 32, "a" * 32
    assert route_template(f"{BASE}/spaces/spc-{lin}-{h}/members") == \
        f"{BASE}/spaces/{{space}}/members"
    assert route_template(f"{BASE}/operations/op-{lin}-{h}/result") == \
        f"{BASE}/operations/{{operation}}/result"
    assert route_template("/etc/passwd") == "other"
    assert route_template(BASE + "/" + "x" * 100) == "other"
    assert route_template("/metrics") == "/metrics"
