"""Upload delivery (aotx_trio/router/upload.py): the SSRF table refused before any
PUT, uploads to a real local HTTPS server (trio TLS + h11, certificates from a
trustme test CA, allowed through the policy's configuration), a failing batch
reporting upload_failed, and presigned URLs never in errors or logs."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trustme

from aotx_trio.errors import ConfigError, InvalidInput, UpstreamFailure
from aotx_trio.router.upload import (
    DEFAULT_SUFFIXES,
    Target,
    UploadPolicy,
    check_targets,
    put_all,
    vet_targets,
)

pytestmark = pytest.mark.timeout(120)

SECRET = "X-Amz-Signature=0123456789abcdefSECRET"
TEST_HOST = "bucket.aotx.test"


def url(host: str = "b.storage.dev", path: str = "/o/1", port: str = "") -> str:
    return f"https://{host}{port}{path}?{SECRET}"


def targets(*urls: str) -> list[dict[str, str]]:
    return [{"output_id": f"id{i}", "put_url": u} for i, u in enumerate(urls)]


def fixed_resolver(table: dict[str, list[str]], calls: list[str] | None = None) -> Any:
    """DNS stand-in (the internet edge): host -> addresses."""
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise OSError("no such host")
        return table[host]
    return resolve


def refusal(exc: pytest.ExceptionInfo[Any]) -> tuple[str, str]:
    assert SECRET not in str(exc.value) and SECRET not in repr(exc.value.fields)
    assert "storage.dev/" not in exc.value.message
    return exc.value.fields["param"], exc.value.fields["rule"]


# --------------------------------------------------------------------------- check_targets

def test_good_targets_are_checked_into_targets() -> None:
    got = check_targets(targets(url(), url("x.y.storage.tigris.dev", "/a/b")), 2,
                        UploadPolicy())
    assert [(t.output_id, t.host, t.port) for t in got] == [
        ("id0", "b.storage.dev", 443), ("id1", "x.y.storage.tigris.dev", 443)]
    assert got[0].request_target == f"/o/1?{SECRET}"
    assert SECRET not in repr(got[0])
    assert check_targets(targets(url(port=":443")), 1, UploadPolicy())[0].port == 443


SSRF_SYNTAX = [
    ("http://b.storage.dev/o?" + SECRET, "scheme"),
    (url(port=":8443"), "port"),
    (url(port=":0"), "port"),
    ("https://user:pw@b.storage.dev/o?" + SECRET, "userinfo"),
    ("https://user@b.storage.dev/o?" + SECRET, "userinfo"),
    (url() + "#frag", "fragment"),
    (url("evil.example.com"), "host"),
    (url("storage.dev"), "host"),                   # the suffix itself is no bucket host
    (url("b.storage.dev.evil.com"), "host"),
    (url("bstorage.dev"), "host"),
    (url("127.0.0.1"), "ip_literal"),
    (url("[::1]"), "ip_literal"),
    (url("169.254.169.254"), "ip_literal"),
    (url("0x7f.1"), "ip_literal"),
    (url("b.storage.dev:99999"), "url"),
    ("https://b.storage.dev/a b?" + SECRET, "url"),
    ("ftp://b.storage.dev/o", "scheme"),
    ("", "required"),
]


@pytest.mark.parametrize(("bad", "rule"), SSRF_SYNTAX)
def test_the_ssrf_table_is_refused_before_any_work(bad: str, rule: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_targets(targets(url(), bad), 2, UploadPolicy())
    assert exc.value.code == "invalid_params" and exc.value.status == 422
    assert refusal(exc) == ("output_targets[1].put_url", rule)
    assert bad[8:] not in exc.value.message or not bad


@pytest.mark.parametrize(("value", "param", "rule"), [
    ("not a list", "output_targets", "type"),
    ([{"output_id": "a", "put_url": url()}], "output_targets", "count"),
    ([{"output_id": "a", "put_url": url()}, "x"], "output_targets[1]", "type"),
    ([{"output_id": "a", "put_url": url()}, {"output_id": "a", "put_url": url()}],
     "output_targets[1].output_id", "duplicate"),
    ([{"output_id": "", "put_url": url()}, {"output_id": "b", "put_url": url()}],
     "output_targets[0].output_id", "required"),
    ([{"put_url": url()}, {"output_id": "b", "put_url": url()}],
     "output_targets[0].output_id", "required"),
    ([{"output_id": "a\n", "put_url": url()}, {"output_id": "b", "put_url": url()}],
     "output_targets[0].output_id", "output_id"),
    ([{"output_id": "a", "put_url": url(), "x": 1}, {"output_id": "b", "put_url": url()}],
     "output_targets[0].x", "unknown"),
    ([{"output_id": "a"}, {"output_id": "b", "put_url": url()}],
     "output_targets[0].put_url", "required"),
])
def test_target_envelope_rules(value: Any, param: str, rule: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        check_targets(value, 2, UploadPolicy())
    assert refusal(exc) == (param, rule)


ADDRESSES = [
    ["127.0.0.1"], ["10.1.2.3"], ["169.254.169.254"], ["172.16.0.1"], ["192.168.1.1"],
    ["0.0.0.0"], ["::1"], ["fc00::1"], ["fe80::1%eth0"], ["::ffff:127.0.0.1"],
    ["100.64.0.1"], ["224.0.0.1"], ["240.0.0.1"], ["2002:7f00:1::1"],
    ["93.184.216.34", "10.0.0.1"],           # one private address among public ones
]


@pytest.mark.parametrize("addresses", ADDRESSES)
async def test_hosts_resolving_to_private_addresses_are_refused_before_any_put(
        addresses: list[str]) -> None:
    policy = UploadPolicy(resolver=fixed_resolver({"b.storage.dev": addresses}))
    checked = check_targets(targets(url()), 1, policy)
    with pytest.raises(InvalidInput) as exc:
        await vet_targets(checked, policy)
    assert refusal(exc) == ("output_targets[0].put_url", "address")
    # put_all vets unvetted targets itself: the same refusal as upload_failed, no PUT made
    with pytest.raises(UpstreamFailure) as up:
        await put_all(checked, [b"x"], policy)
    assert up.value.code == "upload_failed" and up.value.fields["reason"] == "address"


async def test_public_addresses_pass_and_are_pinned() -> None:
    policy = UploadPolicy(resolver=fixed_resolver(
        {"b.storage.dev": ["93.184.216.34", "2606:2800:220:1::1", "93.184.216.34"]}))
    (t,) = await vet_targets(check_targets(targets(url()), 1, policy), policy)
    assert t.addresses == ("93.184.216.34", "2606:2800:220:1::1")


async def test_an_unresolvable_host_is_refused() -> None:
    policy = UploadPolicy(resolver=fixed_resolver({}))
    with pytest.raises(InvalidInput) as exc:
        await vet_targets(check_targets(targets(url()), 1, policy), policy)
    assert refusal(exc) == ("output_targets[0].put_url", "unresolvable")


def test_policy_from_config() -> None:
    assert UploadPolicy.from_config({}) == UploadPolicy() == UploadPolicy.from_config(None)
    assert UploadPolicy().allowed_host_suffixes == DEFAULT_SUFFIXES
    p = UploadPolicy.from_config({"allowed_host_suffixes": ["localhost", ".aotx.test"],
                                  "allow_private_addresses": True, "allowed_ports": [443, 8443],
                                  "timeout_s": 5, "ca_file": "/tmp/ca.pem",
                                  "max_concurrency": 2})
    assert p.host_allowed("localhost") and p.host_allowed("a.aotx.test")
    assert not p.host_allowed("aotx.test") and not p.host_allowed("xlocalhost")
    assert p.allowed_ports == (443, 8443) and p.timeout_s == 5.0 and p.ca_file == "/tmp/ca.pem"
    for bad in ({"allowed_host_suffixes": []}, {"allowed_host_suffixes": ["Bad Host"]},
                {"allow_private_addresses": "yes"}, {"allowed_ports": [0]}, {"timeout_s": 0},
                {"max_concurrency": 0}, {"other": 1}):
        with pytest.raises(ConfigError) as exc:
            UploadPolicy.from_config(bad)
        assert exc.value.fields["key"] == f"router.upload.{next(iter(bad))}"


def test_address_rules() -> None:
    strict, lax = UploadPolicy(), UploadPolicy(allow_private_addresses=True)
    assert strict.address_allowed("93.184.216.34") and strict.address_allowed("2606:4700::1")
    for a in ("127.0.0.1", "10.0.0.1", "::1", "fe80::1", "not-an-ip"):
        assert not strict.address_allowed(a)
    assert lax.address_allowed("127.0.0.1") and lax.address_allowed("10.0.0.1")
    assert not lax.address_allowed("0.0.0.0") and not lax.address_allowed("::")
    assert not lax.address_allowed("224.0.0.1")


# --------------------------------------------------------------------------- a real HTTPS server


@dataclass
class Server:
    port: int
    received: list[tuple[str, str, bytes]] = field(default_factory=list)   # host, path, body


async def _handle(stream: trio.SSLStream[trio.SocketStream], server: Server) -> None:
    conn = h11.Connection(h11.SERVER)
    request: h11.Request | None = None
    body = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return
        assert request is not None
        path = request.target.decode()
        host = dict(request.headers)[b"host"].decode()
        server.received.append((host, path, body))
        if path.startswith("/fail"):
            status, headers = 500, [("Content-Length", "0")]
        elif path.startswith("/redirect"):
            status, headers = 307, [("Location", f"https://localhost:{server.port}/moved"),
                                    ("Content-Length", "0")]
        else:
            status, headers = 200, [("Content-Length", "0")]
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
    except (trio.BrokenResourceError, h11.ProtocolError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


@pytest.fixture
def ca(tmp_path: Path) -> tuple[trustme.CA, str]:
    authority = trustme.CA()
    path = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(path))
    return authority, str(path)


@pytest.fixture
async def https(ca: tuple[trustme.CA, str]) -> AsyncIterator[Server]:
    import ssl
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca[0].issue_cert("localhost", TEST_HOST).configure_cert(ctx)
    async with trio.open_nursery() as nursery:
        box: list[Server] = []
        listeners = await nursery.start(functools.partial(
            trio.serve_ssl_over_tcp, lambda s: _handle(s, box[0]), 0, ctx, host="127.0.0.1"))
        box.append(Server(listeners[0].transport_listener.socket.getsockname()[1]))
        yield box[0]
        nursery.cancel_scope.cancel()


def local_policy(server: Server, ca_file: str, **kw: Any) -> UploadPolicy:
    """Loopback allowed through configuration: the checks still run."""
    return UploadPolicy.from_config({
        "allowed_host_suffixes": ["localhost", ".aotx.test"], "allow_private_addresses": True,
        "allowed_ports": [server.port], "ca_file": ca_file, "timeout_s": 10, **kw})


def local(server: Server, path: str, host: str = "localhost") -> str:
    return f"https://{host}:{server.port}{path}?{SECRET}"


async def test_upload_to_a_local_https_server(https: Server, ca: tuple[trustme.CA, str]) -> None:
    policy = local_policy(https, ca[1])
    raw = targets(local(https, "/a"), local(https, "/b"), local(https, "/c"))
    checked = await vet_targets(check_targets(raw, 3, policy), policy)
    bodies = [b"one", b"\x00" * 200_000, b""]
    assert await put_all(checked, bodies, policy) == ["id0", "id1", "id2"]
    got = sorted(https.received)
    assert got == sorted((f"localhost:{https.port}", f"{p}?{SECRET}", b) for p, b in
                         zip(("/a", "/b", "/c"), bodies, strict=True))


async def test_the_put_goes_to_the_pinned_address(https: Server,
                                                  ca: tuple[trustme.CA, str]) -> None:
    """The name is resolved once, when vetted; the PUT connects to that address with the
    name as SNI and Host (a second resolution would get 10.0.0.1)."""
    calls: list[str] = []
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])

    async def flipping(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    policy = UploadPolicy(allowed_host_suffixes=(".aotx.test",), allow_private_addresses=True,
                          allowed_ports=(https.port,), ca_file=ca[1], resolver=flipping)
    checked = await vet_targets(check_targets(targets(local(https, "/p", TEST_HOST)), 1,
                                              policy), policy)
    assert await put_all(checked, [b"pinned"], policy) == ["id0"]
    assert calls == [TEST_HOST]
    assert https.received == [(f"{TEST_HOST}:{https.port}", f"/p?{SECRET}", b"pinned")]


async def test_loopback_is_refused_without_the_setting(https: Server,
                                                       ca: tuple[trustme.CA, str]) -> None:
    policy = local_policy(https, ca[1], allow_private_addresses=False)
    with pytest.raises(InvalidInput) as exc:
        await vet_targets(check_targets(targets(local(https, "/a")), 1, policy), policy)
    assert refusal(exc) == ("output_targets[0].put_url", "address")
    assert https.received == []


async def _failing_batch(https: Server, ca_file: str, paths: Sequence[str],
                         caplog: pytest.LogCaptureFixture) -> UpstreamFailure:
    policy = local_policy(https, ca_file, max_concurrency=1)
    checked = check_targets(targets(*(local(https, p) for p in paths)), len(paths), policy)
    with caplog.at_level(logging.DEBUG), pytest.raises(UpstreamFailure) as exc:
        await put_all(checked, [b"x"] * len(paths), policy)
    err = exc.value
    assert err.code == "upload_failed" and err.status == 502
    text = str(err) + repr(err.envelope()) + caplog.text
    assert SECRET not in text and "/fail" not in text and "/redirect" not in text
    return err


async def test_a_failed_second_put_fails_the_batch(https: Server, ca: tuple[trustme.CA, str],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    err = await _failing_batch(https, ca[1], ["/ok1", "/fail", "/ok3"], caplog)
    assert err.fields == {"param": "output_targets[1]", "output_id": "id1", "reason": "status",
                          "status": 500}
    assert "output_targets[1]" in caplog.text    # logged, without the URL
    assert [p for _, p, _ in https.received][:2] == [f"/ok1?{SECRET}", f"/fail?{SECRET}"]


async def test_a_redirect_is_not_followed(https: Server, ca: tuple[trustme.CA, str],
                                          caplog: pytest.LogCaptureFixture) -> None:
    err = await _failing_batch(https, ca[1], ["/redirect"], caplog)
    assert err.fields["reason"] == "redirect" and err.fields["status"] == 307
    assert [p for _, p, _ in https.received] == [f"/redirect?{SECRET}"]   # not /moved


async def test_an_untrusted_certificate_fails(https: Server, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    err = await _failing_batch(https, str(other), ["/a"], caplog)
    assert err.fields["reason"] == "tls" and https.received == []


async def test_a_dead_port_fails(ca: tuple[trustme.CA, str],
                                 caplog: pytest.LogCaptureFixture) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()                                  # nothing listens there now
    policy = UploadPolicy(allowed_host_suffixes=("localhost",), allow_private_addresses=True,
                          allowed_ports=(port,), ca_file=ca[1])
    checked = check_targets(targets(f"https://localhost:{port}/a?{SECRET}"), 1, policy)
    with caplog.at_level(logging.DEBUG), pytest.raises(UpstreamFailure) as exc:
        await put_all(checked, [b"x"], policy)
    assert exc.value.fields["reason"] == "connection"
    assert SECRET not in caplog.text + str(exc.value)


def test_a_target_never_shows_its_url() -> None:
    t = Target(0, "a", "b.storage.dev", 443, f"/o?{SECRET}")
    assert SECRET not in repr(t) and SECRET not in str(t)
