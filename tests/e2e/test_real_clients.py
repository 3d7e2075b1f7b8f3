"""The agent clients exactly as they ship, against a daemon on loopback TCP with the default model
(models/cairn-code): Claude Code (the `claude` CLI bundled in the claude-agent-sdk wheel), Codex CLI
(openai-codex-cli-bin) and aider (aider-chat, in .venv/aider). Pinned in pyproject.toml (extra
`clients`) and the Makefile; `make test` installs them.

No workaround settings: each client gets only what points it at cairn and what keeps it off the
network (telemetry, update checks, plugin syncs). docs/api.md "Clients" shows the same commands.
Each conversation asserts: every turn completes; no 4xx in the daemon's log; turn 2 reads at least
90 % of its prompt from cache; a second new conversation reads the system prompt from cache. A tool
round trip goes through each agent binary: the default model seldom calls tools by itself, so a
loopback proxy of the test's own sets `tool_choice` on one request (the daemon is unchanged).
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from daemon_harness import daemon

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "cairn-code"
TURN_TIMEOUT_S = 600          # a turn of the default model takes seconds; this only bounds a hang


def _binary(module: str, *parts: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    path = Path(spec.origin).parent.joinpath(*parts) if spec and spec.origin else None
    if path is None or not path.exists():
        pytest.fail(f"{module} is not installed: `make clients` (or `make test`) installs the pinned agent clients")
    return path


def _aider() -> Path:
    path = Path(sys.prefix) / "aider" / "bin" / "aider"
    if not path.exists():
        pytest.fail(f"{path} is missing: `make clients` (or `make test`) makes the aider venv")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from cairn.daemon.service.config import load_settings
    from cairn.daemon.service.main import load

    state = tmp_path_factory.mktemp("real-clients-state")
    return load(load_settings({"model": str(MODEL), "threads": 2, "checkpoint_dir": str(state)}, {}))


@asynccontextmanager
async def serving(loaded, tmp_path, **settings):
    """The daemon on loopback TCP; yields (port, the structlog events it logged)."""
    port = _free_port()
    with capture_logs() as logs:
        async with daemon(loaded, tmp_path / "d.sock", tcp=f"127.0.0.1:{port}", **settings):
            yield port, logs


class ToolChoiceProxy:
    """A loopback proxy in front of the daemon that sets `tool_choice` on the first request of one
    path, and `also` (fields) on every request of it, and records every request body it forwards.
    Replies are forwarded whole."""

    def __init__(self, upstream: int, path: str, tool_choice: dict, also: dict | None = None) -> None:
        self.bodies: list[dict] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n) if n else b""
                if raw and self.path.split("?")[0] == path:
                    body = {**json.loads(raw), **(also or {})}
                    if not proxy.bodies or all(b.get("_forced") is None for b in proxy.bodies):
                        body["tool_choice"] = tool_choice
                        proxy.bodies.append({**body, "_forced": True})
                    else:
                        proxy.bodies.append(body)
                    raw = json.dumps(body).encode()
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=TURN_TIMEOUT_S)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "accept-encoding", "connection")}
                conn.request(self.command, self.path, body=raw, headers=headers)
                r = conn.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_HEAD = _forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def run(cmd: list, *, cwd: Path, env: dict) -> str:
    """Run a client to completion; its output. A non-zero exit fails the test with what it printed."""
    with trio.fail_after(TURN_TIMEOUT_S):
        p = await trio.run_process([str(c) for c in cmd], cwd=cwd, env=env, stdin=b"", capture_stdout=True,
                                   capture_stderr=True, check=False)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    assert p.returncode == 0, f"{cmd[0]} exited {p.returncode}\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
    return out


def requests_logged(logs) -> list[dict]:
    return [e for e in logs if e.get("event") == "request"]


def assert_no_4xx(logs) -> None:
    for r in requests_logged(logs):     # the figures, for `pytest -s` (docs/benchmarks.md quotes them)
        print(f"{r['request_id']}: prompt {r['prompt_tokens']}, reused {r['reused_tokens']}, "
              f"completion {r['completion_tokens']}, ttft {r['ttft_ms']} ms")
    rejected = [e for e in logs if e.get("event") == "request_rejected"]
    assert not rejected, rejected


def assert_turn_two_cached(first: dict, second: dict, *, reply_sent_back: bool = True) -> None:
    """Turn 2 reads at least 90 % of its prompt from cache, and all of turn 1's prompt and, when the
    client sent it back, its reply: that comes back as the client got it and is replayed with the ids
    the model generated (daemon/protocol/reply_ids.py); only its final end-of-sequence token was never
    computed."""
    assert second["reused_tokens"] >= 0.9 * second["prompt_tokens"], second
    # the last prompt token is never reused when the next turn renders it otherwise (V4's `<think>`)
    want = first["prompt_tokens"] + (first["completion_tokens"] - 1 if reply_sent_back else -1)
    assert second["reused_tokens"] >= want, (first, second)


def system_checkpoint_tokens(logs) -> int:
    sizes = [e["tokens"] for e in logs if e.get("event") == "checkpoint_store" and e.get("kind") == "system"]
    assert sizes, "no system-prefix checkpoint was taken"
    return sizes[0]


def _base_env(home: Path) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "TMPDIR": str(home)}


# --- Claude Code --------------------------------------------------------------------------------

def claude_env(home: Path, port: int) -> dict:
    return {**_base_env(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": "cairn",
            # off the network: no preconnect, no telemetry, no update or feature-flag fetches
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}


def claude_cmd(*args: str) -> list:
    return [_binary("claude_agent_sdk", "_bundled", "claude"), "-p", *args, "--model", "cairn-code"]


async def test_claude_code_turns_continue_and_a_new_conversation_read_the_cache(loaded, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    async with serving(loaded, tmp_path) as (port, logs):
        env = claude_env(home, port)
        await run(claude_cmd("Say hi."), cwd=work, env=env)
        n1 = len(requests_logged(logs))
        await run(claude_cmd("--continue", "And again, please."), cwd=work, env=env)
        n2 = len(requests_logged(logs))
        # a new conversation in the same project: another first message, so another billing-header
        # hash (Claude Code's system prompt also names the project's directory and memory path)
        await run(claude_cmd("What is a list comprehension?"), cwd=work, env=env)
    reqs = requests_logged(logs)
    assert n1 >= 1 and n2 > n1 and len(reqs) > n2 and all(r["outcome"] == "done" for r in reqs), reqs
    assert_no_4xx(logs)
    # turn 2 (`--continue`) carries turn 1's conversation: its first request against turn 1's last.
    # Claude Code leaves out a reply with nothing visible (the default model often only thinks); the
    # tool test below checks a reply that always comes back (its tool call)
    assert_turn_two_cached(reqs[n1 - 1], reqs[n1], reply_sent_back=False)
    # the new conversation differs from the first at its first user message: everything before it
    # (the system prompt and the tools) is read from cache
    assert reqs[n2]["reused_tokens"] >= system_checkpoint_tokens(logs), reqs[n2]
    dropped = [e for e in logs if e.get("event") == "request_nonce_dropped"]
    assert dropped and all("anthropic-billing-header" in w for e in dropped for w in e["where"])


async def test_claude_code_runs_a_tool_and_sends_its_result_back(loaded, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    async with serving(loaded, tmp_path) as (port, logs):
        # ListAgents: a tool Claude Code runs itself whose every argument is bounded (maxLength 256), so
        # a random-ish model's forced call closes (an unbounded string argument could run to max_tokens)
        # Thinking off on every request, as Anthropic's API requires with a forced tool: under thinking
        # the reasoning before the forced call is free text, unbounded for this model (it once ran
        # 26,886 tokens and pushed the next request past the context); every request, so that all
        # turns share one mode and turn 2 can read turn 1 from cache
        proxy = ToolChoiceProxy(port, "/v1/messages", {"type": "tool", "name": "ListAgents"},
                                also={"thinking": {"type": "disabled"}})
        try:
            await run(claude_cmd("Which agents are there?"), cwd=work,
                      env=claude_env(home, proxy.port))
        finally:
            proxy.close()
    assert_no_4xx(logs)
    forced, after = proxy.bodies[0], proxy.bodies[1:]
    assert forced["_forced"] and after, proxy.bodies
    results = [b for m in after[0]["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    uses = [b for m in after[0]["messages"] if m["role"] == "assistant" for b in m["content"]
            if b.get("type") == "tool_use"]
    reqs = requests_logged(logs)
    assert_turn_two_cached(reqs[0], reqs[1])       # the call's reply came back, replayed: all reused
    assert uses and uses[0]["name"] == "ListAgents" and results and results[0]["tool_use_id"] == uses[0]["id"], \
        (reqs, [[(m["role"], m["content"] if isinstance(m["content"], str) else [b.get("type") for b in m["content"]])
                 for m in b["messages"][2:]] for b in proxy.bodies])
    assert all(r["outcome"] == "done" for r in reqs) and len(reqs) >= 2


# --- Codex CLI ----------------------------------------------------------------------------------

def codex_home(tmp_path: Path, port: int) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(f"""\
model = "cairn-code"
model_provider = "cairn"
check_for_update_on_startup = false

[model_providers.cairn]
name = "cairn"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"

# off the network: no plugin sync (github.com, chatgpt.com), no metrics export
[features]
plugins = false

[analytics]
enabled = false
""")
    return home


def codex_cmd(*args: str) -> list:
    return [_binary("codex_cli_bin", "bin", "codex"), "exec", "--skip-git-repo-check", *args]


async def test_codex_exec_resume_and_a_new_conversation_read_the_cache(loaded, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    async with serving(loaded, tmp_path, reasoning="thinking") as (port, logs):
        env = {**_base_env(home), "CODEX_HOME": str(codex_home(tmp_path, port))}
        await run(codex_cmd("Say hi."), cwd=work, env=env)
        n1 = len(requests_logged(logs))
        await run(codex_cmd("resume", "--last", "And again, please."), cwd=work, env=env)
        n2 = len(requests_logged(logs))
        await run(codex_cmd("What is a list comprehension?"), cwd=work, env=env)
    reqs = requests_logged(logs)
    assert n1 >= 1 and n2 > n1 and len(reqs) > n2 and all(r["outcome"] == "done" for r in reqs), reqs
    assert_no_4xx(logs)
    assert_turn_two_cached(reqs[n1 - 1], reqs[n1])
    assert reqs[n2]["reused_tokens"] >= system_checkpoint_tokens(logs), reqs[n2]


async def test_codex_runs_a_tool_and_sends_its_output_back(loaded, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    async with serving(loaded, tmp_path, reasoning="thinking") as (port, logs):
        # get_goal: a tool Codex runs itself that takes no arguments, so the forced call closes at once
        # Reasoning off on every request (as the Claude Code test does): the reasoning before a forced call is
        # free text, unbounded for this random-weight model (it ran to ~8k tokens here); every request, so
        # both turns share one mode and turn 2 still reads turn 1 from cache.
        proxy = ToolChoiceProxy(port, "/v1/responses", {"type": "function", "name": "get_goal"},
                                also={"reasoning": {"effort": "none"}})
        try:
            env = {**_base_env(home), "CODEX_HOME": str(codex_home(tmp_path, proxy.port))}
            await run(codex_cmd("What is the current goal?"), cwd=work, env=env)
        finally:
            proxy.close()
    assert_no_4xx(logs)
    forced, after = proxy.bodies[0], proxy.bodies[1:]
    assert forced["_forced"] and after, proxy.bodies
    reqs = requests_logged(logs)
    assert_turn_two_cached(reqs[0], reqs[1])       # the call came back, replayed: all reused
    calls = [i for i in after[0]["input"] if i.get("type") == "function_call"]
    outputs = [i for i in after[0]["input"] if i.get("type") == "function_call_output"]
    assert calls and calls[0]["name"] == "get_goal" and outputs and outputs[0]["call_id"] == calls[0]["call_id"]


# --- aider --------------------------------------------------------------------------------------

async def test_aider_answers_one_turn(loaded, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    (work / "hello.py").write_text("def hello():\n    return 'hi'\n")
    # aider sends no max_tokens: the daemon's --max-tokens-default bounds its reply (docs/api.md, aider)
    async with serving(loaded, tmp_path, max_tokens_default=256) as (port, logs):
        env = {**_base_env(home), "OPENAI_API_BASE": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "cairn",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True"}      # litellm's model table from the wheel, not the web
        out = await run([_aider(), "--model", "openai/cairn-code", "--message", "Explain hello.py in one line.",
                         "--yes-always", "--no-git", "--no-check-update", "--analytics-disable",
                         "--no-show-model-warnings", "--no-stream", "--no-pretty", "--map-tokens", "0",
                         "hello.py"], cwd=work, env=env)
    reqs = requests_logged(logs)
    assert reqs and all(r["outcome"] == "done" for r in reqs), (reqs, out[-2000:])
    assert_no_4xx(logs)
