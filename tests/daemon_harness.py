"""Test helpers: start a daemon in-process, talk raw HTTP/1.1 over its Unix socket."""

from __future__ import annotations

import json
import socket
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from cairn.daemon.service.config import load_settings
from cairn.daemon.service.main import Loaded, run_daemon




def fake_loaded(model_dir: Path, **fake_kw) -> Loaded:
    import fake_kernel
    from cairn.daemon.protocol.chat_encoding import choose_renderer
    from cairn.daemon.weights.model_dir import open_model_dir
    from cairn.daemon.protocol.tokenizer import TextTokenizer

    md = open_model_dir(model_dir)
    tok = TextTokenizer.from_model_dir(md)
    model = fake_kernel.Model(vocab_size=md.config["vocab_size"], eos_id=tok.eos_id, **fake_kw)
    return Loaded(kernel=fake_kernel, model=model, tokenizer=tok, renderer=choose_renderer(md).renderer,
                  name=md.name, fingerprint="fake" + md.fingerprint, context_length=int(md.config["max_position_embeddings"]))


def real_loaded(model_dir: Path, threads: int = 2, **settings) -> Loaded:
    from cairn.daemon.service.main import load

    # checkpoint_dir also holds the weight-digest cache: keep it next to the test model, not in $HOME
    return load(load_settings({"model": str(model_dir), "threads": threads,
                               "checkpoint_dir": str(model_dir.parent / "state"), **settings}, {}))


@asynccontextmanager
async def daemon(loaded: Loaded, sock: Path, **settings):
    # one slot unless a test asks for more: the default (from the machine's memory) would vary by host
    s = load_settings({"model": "x", "socket": str(sock), "slots": 1, **settings}, {})
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(s, loaded, handle_signals=False, task_status=task_status))
        try:
            yield s
        finally:
            nursery.cancel_scope.cancel()


class Response:
    def __init__(self, status: int, headers: dict, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def events(self) -> list:
        out = []
        for block in self.body.decode().split("\n\n"):
            if block.startswith("data: "):
                data = block[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
        return out


def _request_bytes(method: str, path: str, body) -> bytes:
    if body is None:
        payload = b""
    elif isinstance(body, bytes):
        payload = body
    else:
        payload = json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    return head.encode() + payload


async def request(sock: Path, method: str, path: str, body=None) -> Response:
    stream = await trio.open_unix_socket(str(sock))
    async with stream:
        await stream.send_all(_request_bytes(method, path, body))
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body, rest2 = b"", rest
        while rest2:
            size_line, _, rest2 = rest2.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            body += rest2[:size]
            rest2 = rest2[size + 2:]
        rest = body
    return Response(status, headers, rest)


async def open_request(sock: Path, method: str, path: str, body=None) -> trio.SocketStream:
    """Send a request and return the open stream (the test reads a bit, or closes it = disconnect)."""
    stream = await trio.open_unix_socket(str(sock))
    await stream.send_all(_request_bytes(method, path, body))
    return stream


async def wait_for_event(events: list, pred, timeout: float = 10.0) -> dict:
    """Poll captured structlog events until one satisfies `pred`."""
    with trio.fail_after(timeout):
        while True:
            for e in events:
                if pred(e):
                    return e
            await trio.sleep(0.002)


def reference_greedy(loaded: Loaded, ids: list[int], n: int, chunk: int = 128) -> list[int]:
    """The kernel's own greedy continuation from a fresh state (no daemon involved)."""
    import numpy as np

    k = loaded.kernel
    state = k.State(loaded.model)
    _, logits = k.prefill(state, np.asarray(ids, dtype=np.int32), chunk=chunk)
    out = []
    for i in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        if i + 1 < n:
            logits = k.decode(state, t)
    return out



def token_strings(loaded: Loaded, ids: list[int]) -> list[str]:
    from cairn.daemon.api.formats import token_text

    return [token_text(loaded.tokenizer, i) for i in ids]


def reply_text(loaded: Loaded, ids: list[int]) -> str:
    """The text a reply of these ids shows: a control token the model wrote shows as nothing."""
    from cairn.daemon.protocol.tokenizer import StreamDecoder

    d = StreamDecoder(loaded.tokenizer)
    return "".join(d.push(i) for i in ids) + d.flush()


def unix_get(path: str, url: str = "/health", timeout: float = 30.0) -> bytes:
    """One blocking GET over a Unix socket, the raw response (for daemons run as subprocesses)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def openai_client(sock: Path):
    """The official openai SDK, talking to a daemon over its Unix socket."""
    import httpx
    import openai

    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused",
                         http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))))


async def post_ok(sock: Path, path: str, body) -> dict:
    """POST a JSON body; the 200 answer's JSON (any other status fails the test with the body)."""
    r = await request(sock, "POST", path, body)
    assert r.status == 200, r.body[:500]
    return r.json()
