"""Who may use the TCP listener: the API key check and, without a key, the Host check. Pure.

Without an API key the TCP listener is loopback-only (config and server.check_inherited refuse
anything else), but a browser can still be made to reach it: a page on evil.example whose name is
re-pointed at 127.0.0.1 (DNS rebinding) sends requests that the browser treats as same-origin, so
the page can read the replies. Those requests carry `Host: evil.example`; answering only requests
addressed to a loopback name stops them. The Unix socket is not reachable from a browser: no check.

Operator endpoints (``operator_endpoint``): with an API key set, they need the key on the Unix
socket too. The socket's group may use the model; reading every running request (GET /v1/status)
or deleting checkpoints (GET/DELETE /v1/checkpoints) is the operator's, who holds the key.
Without a key nothing changes: whoever can connect may do everything.
"""

from __future__ import annotations

import hmac
import ipaddress


def api_key_matches(authorization: bytes, api_key: str) -> bool:
    """`Authorization: Bearer <key>`, compared on the header's bytes (the key's UTF-8, so a non-ASCII
    key works) in constant time."""
    return hmac.compare_digest(authorization, b"Bearer " + api_key.encode("utf-8"))


def x_api_key_matches(x_api_key: bytes | None, api_key: str) -> bool:
    """`x-api-key: <key>` (Anthropic's header), compared as `api_key_matches` compares."""
    return x_api_key is not None and hmac.compare_digest(x_api_key, api_key.encode("utf-8"))


def operator_endpoint(path: str) -> bool:
    """The routes that manage the daemon or show other clients' requests: /v1/status and
    /v1/checkpoints (the listing and DELETE /v1/checkpoints/ID)."""
    return path == "/v1/status" or path == "/v1/checkpoints" or path.startswith("/v1/checkpoints/")


def loopback_host(host: bytes) -> bool:
    """Whether a Host header names this machine: `localhost` or a loopback address such as
    127.0.0.1 or [::1], each with an optional port."""
    try:
        text = host.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return False
    if text.startswith("["):                      # [v6]:port
        name, sep, rest = text[1:].partition("]")
        port_sep, port = rest[:1], rest[1:]
        if not sep or (rest and (port_sep != ":" or not port.isdigit())):
            return False
    else:
        name, sep, port = text.partition(":")
        if sep and not port.isdigit():
            return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
