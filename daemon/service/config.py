"""Settings: command-line flags, CAIRN_* environment variables and a TOML file -> one frozen,
validated `Settings`.

Precedence, lowest first: built-in default < config file (`--config` / CAIRN_CONFIG) < environment
< flag. Every setting is described once in `FIELDS` (name, kind, default, meaning, limits); the flag,
the variable and the config key are derived from its name (`checkpoint_slots` -> `--checkpoint-slots`,
`CAIRN_CHECKPOINT_SLOTS`, `checkpoint_slots`). Errors name the setting, where its value came from,
what was wrong and what is allowed.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable


class ConfigError(ValueError):
    """A setting is invalid; the message says which, where it came from and what is allowed."""


def default_socket_path(env: dict[str, str] | None = None) -> str:
    """$RUNTIME_DIRECTORY/cairn.sock (systemd), else $XDG_RUNTIME_DIR/cairn/cairn.sock,
    else /tmp/cairn-$UID/cairn.sock."""
    env = os.environ if env is None else env
    if env.get("RUNTIME_DIRECTORY"):
        return str(Path(env["RUNTIME_DIRECTORY"].split(":")[0]) / "cairn.sock")
    if env.get("XDG_RUNTIME_DIR"):
        return str(Path(env["XDG_RUNTIME_DIR"]) / "cairn" / "cairn.sock")
    return f"/tmp/cairn-{os.getuid()}/cairn.sock"


def default_checkpoint_dir(env: dict[str, str] | None = None) -> str:
    """$STATE_DIRECTORY/checkpoints (systemd StateDirectory=), else $XDG_STATE_HOME/cairn/checkpoints,
    else ~/.local/state/cairn/checkpoints. Checkpoints are state worth keeping across restarts (not a
    cache the system may wipe), and never inside the model directory: model directories are read-only
    inputs."""
    env = os.environ if env is None else env
    if env.get("STATE_DIRECTORY"):
        return str(Path(env["STATE_DIRECTORY"].split(":")[0]) / "checkpoints")
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return str(Path(base) / "cairn" / "checkpoints")


def default_packed_cache_dir(env: dict[str, str] | None = None) -> str:
    """$CACHE_DIRECTORY/packed (systemd CacheDirectory=), else $XDG_CACHE_HOME/cairn/packed, else
    ~/.cache/cairn/packed: packed panels are a cache (rebuilt from the model when missing)."""
    env = os.environ if env is None else env
    if env.get("CACHE_DIRECTORY"):
        return str(Path(env["CACHE_DIRECTORY"].split(":")[0]) / "packed")
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return str(Path(base) / "cairn" / "packed")


@dataclass(frozen=True)
class Field:
    name: str
    kind: type              # int, bool, str
    default: Any            # a value, or a callable taking the environment (computed default)
    help: str
    check: Callable[[Any], str | None] | None = None   # returns what is allowed when the value is wrong
    optional: bool = False  # None allowed (unset)
    flag_only_negative: bool = False  # bool on by default: the flag that changes it is --no-NAME
    metavar: str | None = None        # the value's placeholder in --help (else N for integers, NAME)

    @property
    def flag(self) -> str:
        """The flag that changes the default (a boolean takes --NAME and --no-NAME both)."""
        return ("--no-" if self.flag_only_negative else "--") + self.name.replace("_", "-")

    @property
    def choices(self) -> tuple[str, ...] | None:
        return getattr(self.check, "allowed", None)

    def default_text(self, env: dict[str, str] | None = None) -> str:
        """The default as --help shows it: computed ones (paths) for this environment."""
        value = self.default(os.environ if env is None else env) if callable(self.default) else self.default
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)

    @property
    def env(self) -> str:
        return "CAIRN_" + self.name.upper()


def _range(lo: int | None = None, hi: int | None = None) -> Callable[[int], str | None]:
    def check(v: int) -> str | None:
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            if hi is None:
                return f"an integer >= {lo}"
            return f"an integer from {lo} to {hi}"
        return None
    return check


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v in allowed else f"one of {', '.join(allowed)}"
    check.allowed = allowed          # --help shows them: --speculate {on,off}
    return check


def _tcp(v: str) -> str | None:
    host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return "HOST:PORT, for example 127.0.0.1:8000"
    return None


def _octal_mode(v: str) -> str | None:
    try:
        m = int(v, 8)
    except ValueError:
        return "an octal file mode such as 0660"
    if not 0 <= m <= 0o777:
        return "an octal file mode from 0000 to 0777"
    if m & 0o002:  # anyone on the machine could drive the model; share through a group instead
        return "a mode without write permission for others, e.g. 0660 (let users in through the socket's group)"
    return None


def _expert_cache(v: str) -> str | None:
    from .memory_plan import check_expert_cache

    return check_expert_cache(v)


FIELDS: tuple[Field, ...] = (
    Field("model", str, None, "model to serve: a directory with config.json, or a .gguf file", optional=True,
          metavar="DIR_OR_GGUF"),
    Field("socket", str, default_socket_path, "Unix socket path to listen on", metavar="PATH"),
    Field("socket_mode", str, "0660", "file mode of the Unix socket (octal)", _octal_mode, metavar="MODE"),
    Field("tcp", str, None, "also listen on TCP HOST:PORT (non-loopback needs --api-key)",
          _tcp, optional=True, metavar="HOST:PORT"),
    Field("api_key", str, None, "require 'Authorization: Bearer KEY' on TCP, and on the Unix socket for the "
          "operator endpoints (/v1/status, /v1/checkpoints)", optional=True, metavar="KEY"),
    Field("api_key_file", str, None, "read api_key from this file (e.g. a systemd credential, "
          "$CREDENTIALS_DIRECTORY/api_key); one line, surrounding whitespace ignored", optional=True, metavar="PATH"),
    Field("served_model_name", str, None, "model id in the API; unset: the model's directory or file name",
          optional=True, metavar="ID"),
    Field("segment", int, 4096, "prefill segment size in tokens: the log gets one progress line per segment "
          "(per chunk at log_level debug)", _range(1)),
    Field("chunk", int, 128, "prefill chunk size in tokens (cancel granularity); 1..MAX_CHUNK of the kernel",
          _range(1)),
    Field("progress_interval_ms", int, 250, "least time between two prefill progress messages of a request "
          "(SSE comments, /v1/status); 0: one per segment", _range(0, 60_000)),
    Field("slots", int, None, "conversations the engine holds and runs at once (one live state each; decode "
          "steps batched across them); 1: one request at a time; unset: from the memory plan (1..4)",
          _range(1, 64), optional=True),
    Field("queue_size", int, 8, "requests that may wait for the engine; more get HTTP 429", _range(0, 10_000)),
    Field("speculate", str, "on", "exact speculative decoding: prompt-lookup drafts verified in one kernel call, "
          "the same output as without (auto-off per request while drafts lose): on or off", _one_of("on", "off")),
    Field("threads", int, 0, "kernel threads (0: all cores)", _range(0, 1024)),
    Field("shutdown_timeout_s", int, 25, "seconds SIGTERM / SIGINT gives running work to stop; then the daemon "
          "writes its threads' stacks to stderr and exits 1 (under systemd: below TimeoutStopSec)", _range(1, 3600)),
    Field("log_level", str, "info", "log level", _one_of("debug", "info", "warning", "error")),
    # Unset (as vLLM does): an agent that sends no max_tokens is not cut off mid-answer at an arbitrary length.
    Field("max_tokens_default", int, None, "completion length when a request gives no max_tokens; unset: the rest "
          "of the context (context length - prompt tokens)", _range(1), optional=True),
    Field("reasoning", str, "chat", "chat mode when a request does not choose one: chat (no thinking), thinking, "
          "high or max (thinking with that reasoning effort)", _one_of("chat", "thinking", "high", "max")),
    Field("checkpoints", bool, True, "prefix checkpoints in memory", flag_only_negative=True),
    Field("checkpoint_slots", int, 64, "most checkpoints kept in memory: bytes are the limit (checkpoint_memory_mb); "
          "the count bounds per-request lookup work and the status listing", _range(1, 4096)),
    Field("checkpoint_page_tokens", int, 0, "tokens per page group of a state's compressed rows (checkpoints "
          "share whole pages); 0: 256, rounded up to a multiple of the model's compress rates", _range(0, 1 << 20)),
    Field("checkpoint_share_pages", bool, True, "checkpoints share page groups with live states and each other; "
          "off: every capture copies the whole state (as before pages, for comparisons)", flag_only_negative=True),
    Field("checkpoint_memory_mb", int, 2048, "memory budget for checkpoints (MiB)", _range(0)),
    Field("disk_checkpoints", bool, False, "also keep checkpoints on disk (survive restarts)"),
    Field("checkpoint_dir", str, default_checkpoint_dir,
          "where disk checkpoints (a subdirectory per model) and the weight-digest cache live", metavar="DIR"),
    Field("checkpoint_disk_mb", int, 8192, "disk budget for checkpoints (MiB)", _range(0)),
    Field("shared_checkpoint_dir", str, None, "disk checkpoints in a directory shared by several daemons of the "
          "model (a shared file system); turns the disk tier on, checkpoint_disk_mb is the whole directory's "
          "budget", optional=True, metavar="DIR"),
    Field("checkpoint_min_tokens", int, 512, "shortest prefix worth a checkpoint (tokens)", _range(1)),
    Field("packed_cache_dir", str, default_packed_cache_dir,
          "where a large model's packed weight panels are cached between starts (a rebuildable cache)",
          metavar="DIR"),
    Field("packed_cache_budget_mb", int, 0, "disk cap for packed_cache_dir (MiB): after a load, a model's older "
          "packed files always go, and other models' files that no running daemon uses are removed, least "
          "recently used first, down to it; 0: no cap (one current file per model directory)", _range(0)),
    Field("expert_cache", str, "auto", "memory for routed experts; the rest is read from the packed cache file on "
          "disk as tokens need them (larger-than-memory models): auto (from available memory and the cgroup "
          "limit), all or 0 (every expert resident), a size such as 800M or 12G, or a share such as 25%",
          _expert_cache, metavar="{auto,all,SIZE,SHARE}"),
    Field("expert_prefetch", str, "on", "with paged experts, read a layer's experts before its turn: a hash "
          "layer's from the token ids, others guessed by the layer's router one layer early (only the reads are "
          "speculative: the same output either way): on or off", _one_of("on", "off")),
)


@dataclass(frozen=True, slots=True)
class Settings:
    model: str | None
    socket: str
    socket_mode: str
    tcp: str | None
    api_key: str | None
    api_key_file: str | None
    served_model_name: str | None
    segment: int
    chunk: int
    progress_interval_ms: int
    slots: int | None          # None: chosen at start by the memory plan (daemon/service/memory_plan.py)
    queue_size: int
    speculate: str
    threads: int
    shutdown_timeout_s: int
    log_level: str
    max_tokens_default: int | None
    reasoning: str
    checkpoints: bool
    checkpoint_slots: int
    checkpoint_page_tokens: int
    checkpoint_share_pages: bool
    checkpoint_memory_mb: int
    disk_checkpoints: bool
    checkpoint_dir: str
    checkpoint_disk_mb: int
    shared_checkpoint_dir: str | None
    checkpoint_min_tokens: int
    packed_cache_dir: str
    packed_cache_budget_mb: int
    expert_cache: str          # daemon/service/memory_plan.py parses it; "auto" sizes it from memory at start
    expert_prefetch: str

    @property
    def socket_mode_int(self) -> int:
        return int(self.socket_mode, 8)

    @property
    def tcp_host_port(self) -> tuple[str, int] | None:
        if self.tcp is None:
            return None
        host, _, port = self.tcp.rpartition(":")
        return host.strip("[]"), int(port)


assert [f.name for f in FIELDS] == [f.name for f in fields(Settings)]
_BY_NAME = {f.name: f for f in FIELDS}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; absent flags stay None so lower layers show through. The help shows each
    default itself (argparse's would be None, the "not given" of the layering) and a setting's choices;
    a boolean takes --NAME and --no-NAME both (either may undo a config file or variable)."""
    parser.add_argument("--config", default=None, metavar="PATH",
                        help="TOML file with settings (keys as below, snake_case)")
    for f in FIELDS:
        text = f"{f.help} (default: {f.default_text()}; {f.env})".replace("%", "%%")  # argparse %-formats help
        if f.kind is bool:
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=text)
        else:
            choices = f.choices
            metavar = f.metavar or ("{" + ",".join(choices) + "}" if choices else
                                    "N" if f.kind is int else f.name.upper())
            parser.add_argument(f.flag, dest=f.name, default=None, help=text, metavar=metavar)


def _convert(f: Field, value: Any, source: str) -> Any:
    where = f"setting {f.name!r} (from {source})"
    if isinstance(value, str) and source != "config file":
        if f.kind is bool:
            low = value.strip().lower()
            if low in _TRUE | _FALSE:
                return low in _TRUE
            raise ConfigError(f"{where}: {value!r} is not a boolean; allowed: true/false, 1/0, yes/no, on/off")
        if f.kind is int:
            try:
                return int(value.strip())
            except ValueError:
                raise ConfigError(f"{where}: {value!r} is not an integer") from None
        return value
    if f.kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not a boolean; allowed: true or false")
    if f.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: {value!r} is not an integer")
    if f.kind is str and not isinstance(value, str):
        if f.name == "socket_mode" and isinstance(value, int):
            return oct(value)[2:].rjust(4, "0")
        if f.name == "expert_cache" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)          # a TOML integer: bytes
        raise ConfigError(f"{where}: {value!r} is not a string")
    return value


def _read_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML ({e})") from None
    unknown = sorted(set(data) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
                          f"allowed: {', '.join(_BY_NAME)}")
    return data


def load_settings(args: argparse.Namespace | dict | None = None, env: dict[str, str] | None = None,
                  *, max_chunk: int | None = None) -> Settings:
    """Merge the layers and validate. `max_chunk` is the kernel's MAX_CHUNK (checked when given)."""
    env = dict(os.environ) if env is None else env
    flags = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    config_path = flags.get("config") or env.get("CAIRN_CONFIG")
    from_file = _read_config_file(config_path) if config_path else {}

    values: dict[str, Any] = {}
    for f in FIELDS:
        if flags.get(f.name) is not None:
            value, source = _convert(f, flags[f.name], f"flag {f.flag}"), f"flag {f.flag}"
        elif env.get(f.env) not in (None, ""):
            value, source = _convert(f, env[f.env], f"environment {f.env}"), f"environment {f.env}"
        elif f.name in from_file:
            value, source = _convert(f, from_file[f.name], "config file"), f"config file key {f.name}"
        else:
            value, source = (f.default(env) if callable(f.default) else f.default), "default"
        if value is not None and f.check is not None:
            allowed = f.check(value)
            if allowed:
                raise ConfigError(f"setting {f.name!r} (from {source}): {value!r} is not allowed; expected {allowed}")
        if value is None and not f.optional:
            raise ConfigError(f"setting {f.name!r}: missing")
        values[f.name] = value
    if values["api_key_file"] is not None:
        values["api_key"] = read_api_key_file(values["api_key_file"], values["api_key"])
    s = Settings(**values)
    _check_together(s, max_chunk)
    return s


def read_api_key_file(path: str, api_key: str | None = None) -> str:
    """The key in ``path`` (surrounding whitespace stripped). ``api_key`` set as well is an error:
    two sources of one secret would leave the operator guessing which one is in force."""
    if api_key is not None:
        raise ConfigError("settings 'api_key' and 'api_key_file': both set; expected one of them")
    try:
        with open(path, encoding="utf-8") as fh:
            key = fh.read().strip()
    except OSError as e:
        raise ConfigError(f"setting 'api_key_file': cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"setting 'api_key_file': {path} is not UTF-8 text") from None
    if not key:
        raise ConfigError(f"setting 'api_key_file': {path} is empty; expected the secret on one line")
    return key


def _check_together(s: Settings, max_chunk: int | None) -> None:
    if max_chunk is not None and s.chunk > max_chunk:
        raise ConfigError(f"setting 'chunk': {s.chunk} is not allowed; expected an integer from 1 to {max_chunk} "
                          "(the kernel's MAX_CHUNK)")
    if s.segment < s.chunk:
        raise ConfigError(f"setting 'segment': {s.segment} is smaller than chunk ({s.chunk}); "
                          "expected segment >= chunk")
    hp = s.tcp_host_port
    if hp is not None and hp[0] not in LOOPBACK and not s.api_key:
        raise ConfigError(f"setting 'tcp': host {hp[0]!r} is not loopback; listening beyond this machine "
                          "needs --api-key (CAIRN_API_KEY) so requests are authenticated")
    if s.api_key is not None and not s.api_key.strip():
        raise ConfigError("setting 'api_key': empty; expected a non-empty secret")
