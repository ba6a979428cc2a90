"""The signing key file, the signature and the consumer's check of docs/webhooks.md
(tampered body, wrong key, stale or future timestamp refused), the URL rules, and
the gateway.json ``webhooks`` section with ``aotx serve``'s key creation."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import nacl.signing
import pytest

from aotx_trio.config import load_gateway_config, parse_gateway_config
from aotx_trio.errors import ConfigError, InvalidInput
from aotx_trio.webhooks import signing
from aotx_trio.webhooks.targets import check_url

pytestmark = pytest.mark.timeout(120)


def test_key_file_and_consumer_check(tmp_path: Path) -> None:
    path = signing.create_key(tmp_path / "k")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        signing.create_key(path)                    # never overwritten
    key = signing.load_key(path)
    pub = signing.public_hex(key)
    body = b'{"schema":1,"type":"alias.moved"}'
    h = signing.sign(key, 1_000_000, body)
    ts, sig = h["X-Serving-Timestamp"], h["X-Serving-Signature"]
    assert signing.verify(pub, ts, sig, body, now=1_000_100)
    # the bytes verified are exactly "{timestamp}.{raw body}"
    nacl.signing.VerifyKey(bytes.fromhex(pub)).verify(
        b"1000000." + body, bytes.fromhex(sig.removeprefix("ed25519=")))
    assert not signing.verify(pub, ts, sig, body + b" ", now=1_000_100)      # tampered
    assert not signing.verify(pub, ts, sig, body.replace(b"alias", b"model"), now=1_000_100)
    other = signing.public_hex(nacl.signing.SigningKey.generate())
    assert not signing.verify(other, ts, sig, body, now=1_000_100)           # wrong key
    assert not signing.verify(pub, ts, sig, body, now=1_000_301)             # stale
    assert not signing.verify(pub, ts, sig, body, now=999_699)               # future
    assert not signing.verify(pub, "1000001", sig, body, now=1_000_100)      # other ts
    assert not signing.verify(pub, ts, None, body, now=1_000_100)            # unsigned
    assert not signing.verify(pub, ts, "sha256=00", body, now=1_000_100)


def test_bad_key_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        signing.load_key(tmp_path / "missing")
    assert exc.value.fields["key"] == "webhooks.signing_key_file"
    (tmp_path / "short").write_text("abcd\n")
    with pytest.raises(ConfigError):
        signing.load_key(tmp_path / "short")


@pytest.mark.parametrize(("url", "insecure", "rule"), [
    ("http://h.example/x", False, "scheme"),
    ("ftp://h.example/x", True, "scheme"),
    ("https://user:pw@h.example/x", False, "userinfo"),
    ("https://h.example/x#frag", False, "fragment"),
    ("https://127.1/x", False, "host"),
    ("https://h.example:99999/x", False, "url"),
    ("", False, "required"),
])
def test_url_rules(url: str, insecure: bool, rule: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_url(url, insecure)
    assert (exc.value.fields["param"], exc.value.fields["rule"]) == ("url", rule)


def test_url_target_hides_the_query() -> None:
    t = check_url("https://h.example:8443/hook?token=SECRET", False)
    assert (t.host, t.port, t.tls) == ("h.example", 8443, True)
    assert "SECRET" not in repr(t) and "SECRET" not in t.shown()
    assert check_url("http://[::1]/x", True).host_header == "[::1]"


def test_config_section(tmp_path: Path) -> None:
    cfg = parse_gateway_config({"webhooks": {"signing_key_file": "k", "retry_interval_s": 5,
                                             "allow_insecure_targets": True, "timeout_s": 3}})
    assert cfg.webhooks.retry_interval_s == 5 and cfg.webhooks.allow_insecure_targets
    assert parse_gateway_config({}).webhooks.retry_interval_s == 30
    with pytest.raises(ConfigError) as exc:
        parse_gateway_config({"webhooks": {"retry_interval": 5}})
    assert exc.value.fields["key"] == "webhooks.retry_interval"
    (tmp_path / "gateway.json").write_text(json.dumps({"webhooks": {"signing_key_file": "k"}}))
    assert load_gateway_config(tmp_path / "gateway.json").webhooks.signing_key_file == \
        tmp_path.resolve() / "k"


def test_serve_creates_the_key_once(tmp_path: Path) -> None:
    from aotx_trio.serve import KEY_NAME, ensure_config

    cfg, token = ensure_config(tmp_path, "127.0.0.1:0")
    assert token is not None
    key = tmp_path / KEY_NAME
    assert cfg.webhooks.signing_key_file == tmp_path.resolve() / KEY_NAME
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    raw = json.loads((tmp_path / "gateway.json").read_text())
    assert raw["webhooks"]["signing_key_file"] == KEY_NAME
    seed = key.read_bytes()
    again, token2 = ensure_config(tmp_path, "127.0.0.1:0")
    assert token2 is None and key.read_bytes() == seed
    assert again.webhooks.signing_key_file == cfg.webhooks.signing_key_file


async def test_private_addresses_refused_unless_allowed() -> None:
    from aotx_trio.webhooks.targets import policy, vet

    for url in ("https://localhost:8443/hook", "https://127.0.0.1/hook",
                "https://[::1]/hook", "https://10.1.2.3/hook", "https://169.254.169.254/x"):
        with pytest.raises(InvalidInput) as exc:
            await vet(check_url(url, False), policy(False, 5.0, None))
        assert exc.value.fields["rule"] == "address", url
    assert await vet(check_url("http://127.0.0.1:9/x", True), policy(True, 5.0, None)) == \
        ("127.0.0.1",)


def test_the_consumer_example_in_the_docs_refuses_what_it_must() -> None:
    """docs/webhooks.md's own ``verified`` (the first python block), run as written."""
    import re

    text = (Path(__file__).parent.parent / "docs" / "webhooks.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    key = nacl.signing.SigningKey.generate()
    ns: dict[str, object] = {}
    exec(code.replace("<hex from GET /webhooks/signing-key>", signing.public_hex(key)), ns)
    verified = cast(Callable[..., bool], ns["verified"])
    handle = cast(Callable[..., int], ns["handle"])
    body = b'{"operation_id":"op_1","schema":1,"type":"alias.moved"}'
    now = 1_800_000_000
    h = signing.sign(key, now, body)
    assert verified(h, body, now=now + 299)
    assert not verified(h, body + b" ", now=now)
    assert not verified(signing.sign(nacl.signing.SigningKey.generate(), now, body), body,
                        now=now)
    assert not verified(h, body, now=now + 301)
    assert not verified({}, body, now=now)
    applied: list[str] = []
    ns["apply"] = lambda event: applied.append(event["operation_id"])
    fresh = signing.sign(key, int(time.time()), body)
    assert handle(fresh, body) == 204 and handle(fresh, body) == 204
    assert applied == ["op_1"]                                               # deduplicated
    assert handle({}, body) == 401
