"""The commands of docs/operations.md "Scale-out" are ones cairn and smg accept: the `cairn serve`
lines through cairn's own parser and settings, the `smg launch` line through smg's parser, and the
instance configs the `printf` lines write through load_settings."""

from __future__ import annotations

import shlex
from pathlib import Path

from cairn.daemon.cli.main import build_parser
from cairn.daemon.service.config import load_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def section() -> str:
    text = DOC.read_text()
    start = text.index("## Scale-out: several daemons behind a gateway")
    return text[start:text.index("\n## ", start + 1)]


def shell_lines() -> list[list[str]]:
    blocks = section().split("```sh\n")[1:]
    lines = [ln for b in blocks for ln in b.split("```")[0].splitlines()]
    return [shlex.split(ln, comments=True) for ln in lines if ln.strip()]


def test_the_cairn_serve_lines_parse_and_share_one_directory_on_distinct_ports():
    serves = [w for w in shell_lines() if w[:2] == ["cairn", "serve"]]
    assert len(serves) == 2
    settings = []
    for words in serves:
        args = build_parser().parse_args([w for w in words[1:] if w != "&"])
        settings.append(load_settings(args, env={}))
    assert {s.shared_checkpoint_dir for s in settings} == {"~/cairn-shared"}
    assert len({s.tcp for s in settings}) == 2 and len({s.socket for s in settings}) == 2


def test_the_smg_launch_line_parses_with_smg_and_names_both_daemons():
    from smg.launch_router import parse_router_args

    (launch,) = [w for w in shell_lines() if w[:2] == ["smg", "launch"]]
    args = parse_router_args(launch[2:])
    assert args.worker_urls == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert args.policy == "cache_aware" and args.host == "127.0.0.1" and args.prometheus_host == "127.0.0.1"


def test_the_instance_configs_load_with_the_shared_directory_and_their_own_port(tmp_path):
    printfs = [w for w in shell_lines() if w and w[0] == "printf"]
    assert len(printfs) == 2
    ports = set()
    for words in printfs:
        path = tmp_path / Path(words[words.index(">") + 1]).name
        path.write_text(words[1].replace("\\n", "\n"))
        s = load_settings({"config": str(path)}, env={})
        assert s.shared_checkpoint_dir == "/srv/cairn/shared" and s.checkpoint_disk_mb == 65536
        ports.add(s.tcp)
    assert ports == {"127.0.0.1:8001", "127.0.0.1:8002"}
