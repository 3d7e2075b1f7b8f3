"""Operator commands that talk to a running daemon over its Unix socket: `cairn chat`, `cairn status`,
`cairn checkpoints ls|rm`.

The socket is `--socket`, else `CAIRN_SOCKET`, else the path `cairn serve` binds by default
(`config.default_socket_path`). Every command exits 1 with one clear line on stderr when the daemon
cannot be reached or answers with an error.

The API key, when the daemon has one (it then guards /v1/status and /v1/checkpoints on the socket
too): `--api-key-file PATH`, else `CAIRN_API_KEY`, else the file named by `CAIRN_API_KEY_FILE` —
the same names the daemon's settings use. Never a command-line value: `ps` would show it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator

import httpx

from cairn.daemon.service.config import ConfigError, default_socket_path, read_api_key_file
from cairn.daemon.service.socket_dir import SocketDirError, check_socket_dir

# the start command names the model: `cairn serve` alone only says --model is missing
UNREACHABLE = ("cannot reach cairn at {path}: is the daemon running? Start it with `make serve` in the cairn "
               "checkout, or `cairn serve --model DIR_OR_GGUF`; as a service: `systemctl status cairn`")


class ClientError(Exception):
    """One line for stderr; the command exits 1."""


def socket_path(args: argparse.Namespace | None = None) -> str:
    """The socket to use. A path the user gave is theirs to vouch for; the default path is only used
    when its directory is safe (daemon/service/socket_dir.py): a /tmp/cairn-$UID made by another user would
    let them stand in for the daemon and read the prompts."""
    given = getattr(args, "socket", None) or os.environ.get("CAIRN_SOCKET")
    if given:
        return given
    path = default_socket_path()
    try:
        check_socket_dir(os.path.dirname(path))
    except FileNotFoundError:
        pass                          # nothing there: connecting fails with "cannot reach"
    except SocketDirError as e:
        raise ClientError(f"refusing the default socket {path}: {e}") from None
    return path


def api_key(args: argparse.Namespace | None = None, env: dict[str, str] | None = None) -> str | None:
    """The key to send (see the module notes), or None."""
    env = os.environ if env is None else env
    path = getattr(args, "api_key_file", None)
    if not path and env.get("CAIRN_API_KEY"):
        return env["CAIRN_API_KEY"]
    path = path or env.get("CAIRN_API_KEY_FILE")
    if not path:
        return None
    try:
        return read_api_key_file(path)
    except ConfigError as e:
        raise ClientError(str(e).replace("setting 'api_key_file'", "API key file")) from None


class Client:
    """A small synchronous client for the daemon's HTTP API over a Unix socket."""

    def __init__(self, path: str, timeout: float = 30.0, api_key: str | None = None) -> None:
        self.path = path
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://cairn",
                                 timeout=httpx.Timeout(timeout, read=None), headers=headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unreachable(self, e: Exception) -> ClientError:
        msg = UNREACHABLE.format(path=self.path)
        if "ermission denied" in str(e):
            msg += "; permission denied: join the socket's group (docs/operations.md, Socket permissions)"
        return ClientError(msg)

    def request(self, method: str, url: str, **kw) -> httpx.Response:
        try:
            r = self.http.request(method, url, **kw)
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError, ConnectionError) as e:
            raise self._unreachable(e) from None
        check(r)
        return r

    def get_json(self, url: str) -> dict:
        return self.request("GET", url).json()

    def model_id(self) -> str:
        data = self.get_json("/v1/models")["data"]
        if not data:
            raise ClientError("the daemon serves no model")
        return data[0]["id"]

    def stream(self, url: str, body: dict) -> Iterator[tuple[str, object]]:
        """POST with SSE: yields ("progress", dict), ("data", dict), ("comment", str) until [DONE]."""
        try:
            with self.http.stream("POST", url, json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    check(r)
                yield from iter_sse(r.iter_lines())
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as e:
            raise self._unreachable(e) from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
            raise ClientError(f"the daemon closed the stream: {e}") from None


def check(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        err = r.json()["error"]
        msg = err.get("message") or str(err)
    except Exception:
        msg = r.text.strip() or r.reason_phrase
    if r.status_code == 401:
        msg += "; the daemon has an API key: set CAIRN_API_KEY, CAIRN_API_KEY_FILE or --api-key-file"
    raise ClientError(f"HTTP {r.status_code}: {msg}")


def iter_sse(lines) -> Iterator[tuple[str, object]]:
    """Server-sent events, as cairn sends them: `data: JSON`, `data: [DONE]`, `: comment`.
    A `: progress {json}` comment becomes ("progress", dict); an `error` event raises ClientError."""
    for line in lines:
        if not line:
            continue
        if line.startswith(":"):
            text = line[1:].strip()
            if text.startswith("progress "):
                try:
                    yield "progress", json.loads(text[len("progress "):])
                    continue
                except ValueError:
                    pass
            yield "comment", text
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            obj = json.loads(data)
            if isinstance(obj, dict) and "error" in obj:
                raise ClientError(f"the daemon reported an error: {obj['error'].get('message', obj['error'])}")
            yield "data", obj


# --- formatting --------------------------------------------------------------------------------

def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = float(s)
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    return f"{h // 24}d{h % 24:02d}h"


def ago(t, now: float | None = None) -> str:
    """`last_used` as the daemon gives it (unix seconds, ISO text, or null) -> '3m12s ago'."""
    if t is None or t == "":
        return "never"
    if isinstance(t, (int, float)):
        now = time.time() if now is None else now
        if t > 1e9:                                  # wall-clock seconds
            return human_duration(max(0.0, now - t)) + " ago"
        return str(t)
    return str(t)


def progress_line(p: dict, width: int = 30) -> str:
    done, total = int(p.get("done", 0)), max(1, int(p.get("total", 1)))
    frac = min(1.0, done / total)
    filled = int(round(frac * width))
    eta = p.get("eta_s")
    eta_s = "eta ?" if eta is None else f"eta {human_duration(eta)}"
    return f"prefill [{'#' * filled}{'.' * (width - filled)}] {done}/{total} tokens {frac:4.0%} {eta_s}"


class ProgressDisplay:
    """Prefill progress on stderr: a bar redrawn in place on a terminal, one line per update otherwise."""

    def __init__(self, stream=None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = self.tty if enabled is None else enabled
        self.drawn = 0

    def update(self, p: dict) -> None:
        if not self.enabled:
            return
        line = progress_line(p)
        if self.tty:
            self.stream.write("\r" + line.ljust(self.drawn))
            self.drawn = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self.tty and self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()
        self.drawn = 0


# --- cairn chat --------------------------------------------------------------------------------

def chat_turn(client: Client, model: str, messages: list[dict], args, out=None, progress=None) -> str:
    """Stream one assistant reply to `out`; returns its text."""
    out = out or sys.stdout
    body: dict = {"model": model, "messages": messages, "stream": True}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        body["temperature"] = args.temperature
    parts: list[str] = []
    progress = progress or ProgressDisplay(enabled=args.progress)
    try:
        for kind, obj in client.stream("/v1/chat/completions", body):
            if kind == "progress":
                progress.update(obj)
            elif kind == "data":
                for choice in obj.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        if not parts:
                            progress.clear()
                        parts.append(text)
                        out.write(text)
                        out.flush()
    finally:
        progress.clear()
    if not parts or not parts[-1].endswith("\n"):
        out.write("\n")
    out.flush()
    return "".join(parts)


def _base_messages(args) -> list[dict]:
    return [{"role": "system", "content": args.system}] if args.system else []


def _chat(args: argparse.Namespace) -> int:
    with Client(socket_path(args), api_key=api_key(args)) as client:
        model = args.model or client.model_id()
        if args.prompt:
            prompt = " ".join(args.prompt)
        elif sys.stdin.isatty():
            return _repl(client, model, args)
        else:
            prompt = sys.stdin.read()
            if not prompt.strip():
                raise ClientError("no prompt: give one as an argument or on stdin")
        try:
            chat_turn(client, model, _base_messages(args) + [{"role": "user", "content": prompt}], args)
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            return 130
    return 0


def _repl(client: Client, model: str, args) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # pragma: no cover
        pass
    print(f"cairn chat with {model} on {client.path}. Ctrl-D quits, Ctrl-C stops a reply, /reset forgets.",
          file=sys.stderr)
    history: list[dict] = []
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        if not line.strip():
            continue
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            history.clear()
            print("(conversation forgotten)", file=sys.stderr)
            continue
        turn = history + [{"role": "user", "content": line}]
        try:
            reply = chat_turn(client, model, _base_messages(args) + turn, args)
        except KeyboardInterrupt:
            print("\n(stopped; this turn is not kept)", file=sys.stderr)
            continue
        except ClientError as e:
            print(f"cairn chat: {e}", file=sys.stderr)
            if e.args and str(e.args[0]).startswith("cannot reach"):
                return 1
            continue
        history = turn + [{"role": "assistant", "content": reply}]


# --- cairn status ------------------------------------------------------------------------------

def format_status(s: dict) -> str:
    m = s.get("model") or {}
    q = s.get("queue") or {}
    lines = [f"cairn {s.get('version', '?')}  pid {s.get('pid', '?')}  up {human_duration(s.get('uptime_s'))}"]
    lines.append(f"model        {m.get('id')}  fingerprint {str(m.get('fingerprint') or '')[:16]}  "
                 f"context {m.get('context_length')} tokens  kernel threads {m.get('kernel_threads')}")
    lines.append(f"queue        {q.get('depth', 0)} waiting (capacity {q.get('capacity')})")
    active = s.get("active") or ([s["running"]] if s.get("running") else [])
    for r in active:
        eta = "" if r.get("eta_s") is None else f", eta {human_duration(r['eta_s'])}"
        unit = "prompt tokens" if r.get("phase") == "prefill" else "tokens generated (max)"
        lines.append(f"running      {r.get('id')}: {r.get('phase')} {r.get('tokens_done')}/{r.get('tokens_total')} "
                     f"{unit}{eta}")
    if not active:
        lines.append("running      idle")
    lines.append(f"live state   {s.get('live_state_tokens', 0)} tokens")
    for sl in s.get("slots") or ():
        doing = "idle" if sl.get("request_id") is None else f"{sl.get('phase')} {sl.get('request_id')}"
        lines.append(f"slot {sl.get('slot')}       {doing}, state {sl.get('state_tokens', 0)} tokens")
    ck = s.get("checkpoints") or {}
    tiers = ", ".join(f"{tier} {ck[tier].get('count', 0)} ({human_bytes(ck[tier].get('bytes', 0))})"
                      for tier in ("memory", "disk") if isinstance(ck.get(tier), dict))
    if ck.get("enabled") is False:
        tiers += " (checkpoints off)"
    lines.append(f"checkpoints  {tiers or 'none'}")
    rp = s.get("replies")
    if isinstance(rp, dict):
        lines.append(f"replies      {rp.get('entries', 0)} kept ({human_bytes(rp.get('bytes', 0))} of "
                     f"{human_bytes(rp.get('max_bytes', 0))}); {rp.get('replayed_turns', 0)} turn(s) replayed, "
                     f"{rp.get('replayed_tokens', 0)} tokens")
    cd = s.get("cache_diagnostics")
    if isinstance(cd, dict):
        line = (f"cache diag.  {cd.get('compared', 0)} compared, {cd.get('misses', 0)} missed, "
                f"{cd.get('shortfalls', 0)} reused short")
        last = (cd.get("recent") or [None])[-1]
        if isinstance(last, dict):
            line += (f"; last {last.get('request_id')}: {last.get('reason') or 'shortfall'} at token "
                     f"{last.get('first_divergent_token', '?')}, {last.get('tokens_lost', 0)} tokens lost")
        lines.append(line)
    ex = s.get("expert_cache") or {}
    if ex.get("paged"):
        hr = ex.get("hit_rate")
        lines.append(f"experts      paged: cache {human_bytes(ex.get('budget_bytes'))} of "
                     f"{human_bytes(ex.get('expert_bytes_total'))} ({ex.get('slots', '?')} slots); hit rate "
                     f"{'-' if hr is None else f'{100 * hr:.1f}%'} ({ex.get('hits', 0)} hits, {ex.get('misses', 0)} "
                     f"misses), read {human_bytes(ex.get('bytes_read', 0))} in {ex.get('read_s', 0)} s, "
                     f"stalled {ex.get('stall_s', 0)} s")
        if ex.get("prefetch_reads") is not None:
            prec = ex.get("lookahead_precision")
            lines.append(f"             read ahead {ex['prefetch_reads']} ({ex.get('prefetch_used', 0)} used); "
                         f"router lookahead right on {'-' if prec is None else f'{100 * prec:.1f}%'} of "
                         f"{ex.get('lookahead_guesses', 0)} guesses")
    elif ex:
        lines.append("experts      all resident")
    if ex.get("reason"):
        lines.append(f"             {ex['reason']}")
    mem = s.get("memory") or {}
    lines.append(f"memory       RSS {human_bytes(mem.get('rss_bytes'))} (peak {human_bytes(mem.get('peak_rss_bytes'))})")
    plan = mem.get("plan")
    if plan:
        if plan.get("room_bytes") is None:
            lines.append(f"memory plan  no limit known ({plan.get('limit_source')}): no guard")
        else:
            parts = plan.get("parts") or {}
            lines.append(f"memory plan  room {human_bytes(plan.get('room_bytes'))} from {plan.get('limit_source')}")
            lines.append("             " + ", ".join(f"{k} {human_bytes(v)}" for k, v in parts.items()))
            use = mem.get("in_use") or {}
            if use:
                lines.append(f"             in use: states {human_bytes(use.get('states_bytes'))} + checkpoints "
                             f"{human_bytes(use.get('checkpoint_bytes'))} of {human_bytes(use.get('pool_bytes'))}; "
                             f"{use.get('refused', 0)} request(s) ended for memory, {use.get('captures_skipped', 0)} "
                             "capture(s) skipped")
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    with Client(socket_path(args), api_key=api_key(args)) as client:
        s = client.get_json("/v1/status")
    print(json.dumps(s, indent=2) if args.json else format_status(s))
    return 0


# --- cairn checkpoints -------------------------------------------------------------------------

CHECKPOINT_COLUMNS = ("ID", "TOKENS", "KIND", "BYTES", "OWN", "SHARED", "TIER", "HITS", "LAST USE")


def format_checkpoints(rows: list[dict], now: float | None = None) -> str:
    if not rows:
        return "no checkpoints"
    table = [CHECKPOINT_COLUMNS] + [
        (str(r.get("id")), str(r.get("tokens", "")), str(r.get("kind", "")), human_bytes(r.get("bytes")),
         human_bytes(r.get("own_bytes")), human_bytes(r.get("shared_bytes")),
         str(r.get("tier", "")), str(r.get("hits", 0)), ago(r.get("last_used"), now)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(CHECKPOINT_COLUMNS))]
    right = {1, 3, 4, 5, 7}
    return "\n".join("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     .rstrip() for row in table)


def _no_checkpoint_api(e: ClientError) -> ClientError:
    if "HTTP 404" in str(e) and "no route" in str(e):
        return ClientError("this daemon has no /v1/checkpoints endpoint (an older version?)")
    return e


def _checkpoints_ls(args: argparse.Namespace) -> int:
    with Client(socket_path(args), api_key=api_key(args)) as client:
        try:
            data = client.get_json("/v1/checkpoints")
        except ClientError as e:
            raise _no_checkpoint_api(e) from None
    print(json.dumps(data, indent=2) if args.json else format_checkpoints(data.get("data") or []))
    return 0


def _checkpoints_rm(args: argparse.Namespace) -> int:
    status = 0
    with Client(socket_path(args), api_key=api_key(args)) as client:
        for cid in args.ids:
            try:
                client.request("DELETE", f"/v1/checkpoints/{cid}")
                print(f"deleted {cid}")
            except ClientError as e:
                e = _no_checkpoint_api(e)
                if str(e).startswith(UNREACHABLE.split("{")[0]) or "no /v1/checkpoints" in str(e):
                    raise e from None
                print(f"cairn checkpoints rm: {cid}: {e}", file=sys.stderr)
                status = 1
    return status


# --- registration ------------------------------------------------------------------------------

def _guard(func, name: str):
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ClientError as e:
            print(f"cairn {name}: {e}", file=sys.stderr)
            return 1
        except BrokenPipeError:          # `cairn chat ... | head`
            return 0
    return run


def _socket_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", default=None, metavar="PATH",
                   help=f"the daemon's Unix socket (CAIRN_SOCKET; default {default_socket_path()})")
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="file holding the daemon's API key (else CAIRN_API_KEY, CAIRN_API_KEY_FILE)")


def register_cli(subparsers) -> None:
    chat = subparsers.add_parser("chat", help="chat with the running daemon (one-shot, piped or interactive)",
                                 description="One-shot: cairn chat 'prompt'. Piped: echo prompt | cairn chat. "
                                             "Interactive (no prompt, on a terminal): a REPL that keeps the "
                                             "conversation across turns.")
    chat.add_argument("prompt", nargs="*", help="the user message (default: stdin, or a REPL on a terminal)")
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=None, help="reply length limit (default: the daemon's)")
    chat.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: the daemon's, 1)")
    chat.add_argument("--model", default=None, help="model id (default: the one the daemon serves)")
    chat.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="prefill progress on stderr (default: on when stderr is a terminal)")
    _socket_arg(chat)
    chat.set_defaults(func=_guard(_chat, "chat"))

    st = subparsers.add_parser("status", help="what the running daemon is doing (GET /v1/status)")
    st.add_argument("--json", action="store_true", help="the raw JSON")
    _socket_arg(st)
    st.set_defaults(func=_guard(_status, "status"))

    ck = subparsers.add_parser("checkpoints", help="list or delete prefix checkpoints")
    ck_sub = ck.add_subparsers(dest="checkpoints_command", required=True, metavar="ACTION")
    ls = ck_sub.add_parser("ls", help="list checkpoints (GET /v1/checkpoints)")
    ls.add_argument("--json", action="store_true", help="the raw JSON")
    _socket_arg(ls)
    ls.set_defaults(func=_guard(_checkpoints_ls, "checkpoints ls"))
    rm = ck_sub.add_parser("rm", help="delete checkpoints by id (DELETE /v1/checkpoints/ID)")
    rm.add_argument("ids", nargs="+", metavar="ID")
    _socket_arg(rm)
    rm.set_defaults(func=_guard(_checkpoints_rm, "checkpoints rm"))
