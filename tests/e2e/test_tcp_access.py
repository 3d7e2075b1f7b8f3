"""Who may use the TCP listener: without an API key only requests addressed to a loopback name
(DNS rebinding), with one the key compared on bytes; the Unix socket takes any Host.
The daemon runs in-process on the fake kernel (tests/daemon_harness.py)."""

from __future__ import annotations

import socket

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from cairn.daemon.api.access import api_key_matches, loopback_host
from daemon_harness import daemon, fake_loaded


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _raw_unix_get(sock, host: bytes) -> bytes:
    stream = await trio.open_unix_socket(str(sock))
    async with stream:
        await stream.send_all(b"GET /v1/models HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_loopback_tcp_without_api_key_rejects_foreign_host_header(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock, port = tmp_path / "c.sock", _free_port()
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, tcp=f"127.0.0.1:{port}"):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                evil = await c.get("/v1/models", headers={"Host": "evil.example"})
                evil_port = await c.get("/v1/models", headers={"Host": f"evil.example:{port}"})
                rebound = await c.get("/v1/models", headers={"Host": "127.0.0.1.evil.example"})
                ok = {h: (await c.get("/v1/models", headers={"Host": h})).status_code
                      for h in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost", "LocalHost",
                                "[::1]")}
                default = await c.get("/v1/models")          # httpx sends Host: 127.0.0.1:PORT
            unix = await _raw_unix_get(sock, b"evil.example")
    assert evil.status_code == evil_port.status_code == rebound.status_code == 403
    err = evil.json()["error"]
    assert err["code"] == "host_not_allowed" and err["type"] == "permission_error"
    assert "'evil.example' is not allowed" in err["message"] and "DNS rebinding" in err["message"]
    assert "set api_key" in err["message"]
    assert set(ok.values()) == {200} and default.status_code == 200
    assert unix.startswith(b"HTTP/1.1 200 "), unix[:200]


async def test_api_key_with_non_ascii_characters_is_accepted(tiny_model_dir, tmp_path):
    key = "clé-sekrit-✓"
    loaded = fake_loaded(tiny_model_dir)
    sock, port = tmp_path / "c.sock", _free_port()
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, tcp=f"127.0.0.1:{port}", api_key=key):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                right = await c.get("/v1/models", headers={"Authorization": b"Bearer " + key.encode()})
                latin1 = await c.get("/v1/models", headers={"Authorization": b"Bearer " + key[:-1].encode("latin-1")})
                wrong = await c.get("/v1/models", headers={"Authorization": b"Bearer " + key[:-1].encode()})
                # with a key, the key is the check: any Host (a reverse proxy's name) is fine
                proxied = await c.get("/v1/models", headers={"Authorization": b"Bearer " + key.encode(),
                                                             "Host": "cairn.internal"})
    assert right.status_code == 200 and proxied.status_code == 200
    assert latin1.status_code == wrong.status_code == 401


def test_api_key_compared_on_bytes_in_constant_time(monkeypatch):
    import hmac

    from cairn.daemon.api import access

    calls, real = [], hmac.compare_digest
    monkeypatch.setattr(access.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert api_key_matches("Bearer ключ".encode(), "ключ")
    assert not api_key_matches(b"Bearer \xd0", "ключ") and not api_key_matches(b"", "ключ")
    assert calls[0] == ("Bearer ключ".encode(), "Bearer ключ".encode())
    assert all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in calls)


@pytest.mark.parametrize("host, ok", [
    (b"localhost", True), (b"localhost:8000", True), (b"127.0.0.1", True), (b"127.0.0.1:8000", True),
    (b"127.1.2.3:80", True), (b"[::1]", True), (b"[::1]:8000", True), (b"LOCALHOST:1", True),
    (b"evil.example", False), (b"evil.example:8000", False), (b"localhost.evil.example", False),
    (b"127.0.0.1.nip.io", False), (b"[::1]x", False), (b"[::1]:", False), (b"localhost:abc", False),
    (b"::1", False), (b"[::ffff:1.2.3.4]", False), (b"10.0.0.1", False), (b"", False), (b"l\xc3\xb6calhost", False),
])
def test_loopback_host_names(host, ok):
    assert loopback_host(host) is ok


# --- the operator endpoints on the Unix socket ------------------------------------------------------

def _uds(sock, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sock)), base_url="http://cairn",
                             headers=headers, timeout=30)


async def _a_checkpoint(c: httpx.AsyncClient) -> None:
    r = await c.post("/v1/completions", json={"model": "tiny", "prompt": list(range(10, 60)), "max_tokens": 2})
    assert r.status_code == 200


async def test_with_an_api_key_the_operator_endpoints_need_it_on_the_unix_socket_too(tiny_model_dir, tmp_path):
    from cairn.daemon.cli.client import Client, ClientError

    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, api_key="sekrit", checkpoint_min_tokens=16):
            async with _uds(sock) as anon, _uds(sock, "sekrit") as op, _uds(sock, "wrong") as bad:
                await _a_checkpoint(anon)                       # the socket's clients still use the model
                assert (await anon.get("/v1/models")).status_code == 200
                [row] = (await op.get("/v1/checkpoints")).json()["data"]
                for client in (anon, bad):
                    for method, path in (("GET", "/v1/status"), ("GET", "/v1/checkpoints"),
                                         ("DELETE", f"/v1/checkpoints/{row['id']}")):
                        r = await client.request(method, path)
                        assert r.status_code == 401, (method, path)
                        err = r.json()["error"]
                        assert err["code"] == "invalid_api_key" and "API key" in err["message"] and err["type"]
                st = await op.get("/v1/status")
                assert st.status_code == 200 and st.json()["object"] == "status"
                gone = await op.delete(f"/v1/checkpoints/{row['id']}")
                assert gone.status_code == 200 and gone.json()["deleted"] is True
                assert (await op.get("/v1/checkpoints")).json()["data"] == []

            def cli(key):   # the `cairn status` client, with and without the key
                with Client(str(sock), api_key=key) as c:
                    return c.get_json("/v1/status")["object"]
            assert await trio.to_thread.run_sync(cli, "sekrit") == "status"
            with pytest.raises(ClientError, match="HTTP 401.*CAIRN_API_KEY"):
                await trio.to_thread.run_sync(cli, None)


async def test_without_an_api_key_the_operator_endpoints_stay_open_on_the_unix_socket(tiny_model_dir, tmp_path):
    loaded = fake_loaded(tiny_model_dir)
    sock = tmp_path / "c.sock"
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, checkpoint_min_tokens=16):
            async with _uds(sock) as anon:
                await _a_checkpoint(anon)
                assert (await anon.get("/v1/status")).status_code == 200
                [row] = (await anon.get("/v1/checkpoints")).json()["data"]
                assert (await anon.delete(f"/v1/checkpoints/{row['id']}")).status_code == 200


async def test_with_an_api_key_tcp_answers_only_health_without_it(tiny_model_dir, tmp_path):
    """A gateway probes /health before it sends any key (smg does): liveness stays open, nothing else."""
    loaded = fake_loaded(tiny_model_dir)
    sock, port = tmp_path / "c.sock", _free_port()
    with trio.fail_after(30), capture_logs():
        async with daemon(loaded, sock, tcp=f"127.0.0.1:{port}", api_key="sekrit"):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                assert (await c.get("/health")).json()["status"] == "ok"
                for path in ("/v1/models", "/v1/status", "/v1/checkpoints", "/v1/loads", "/server_info"):
                    assert (await c.get(path)).status_code == 401, path
