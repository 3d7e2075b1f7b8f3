"""What a newcomer meets first in `cairn serve` (issue 42 §1): its --help, a busy socket refused
before the model loads, a --model that is a file but no model, and the client's hint when no daemon
answers."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from cairn.daemon.cli.client import UNREACHABLE
from cairn.daemon.cli.main import build_parser
from cairn.daemon.service.config import default_socket_path, load_settings
from cairn.daemon.service.main import serve
from cairn.daemon.weights.model_dir import ModelDirError


def _serve_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["serve"]


def test_serve_help_shows_defaults_choices_and_both_boolean_flags():
    text = " ".join(_serve_parser().format_help().split())       # argparse wraps lines
    assert f"(default: {default_socket_path()}; CAIRN_SOCKET)" in text
    assert "(default: 4096; CAIRN_SEGMENT)" in text and "(default: on; CAIRN_CHECKPOINTS)" in text
    assert "--speculate {on,off}" in text and "--log-level {debug,info,warning,error}" in text
    assert "--speculate SPECULATE" not in text and "--log-level LOG_LEVEL" not in text
    assert "--model DIR_OR_GGUF" in text
    assert "one progress line per segment (per chunk at log_level debug)" in text
    assert "--checkpoint-share-pages, --no-checkpoint-share-pages" in text


@pytest.mark.parametrize("argv, value", [([], None), (["--checkpoint-share-pages"], True),
                                         (["--no-checkpoint-share-pages"], False)])
def test_checkpoint_share_pages_takes_both_flags(argv, value):
    args = _serve_parser().parse_args(argv)
    assert args.checkpoint_share_pages is value
    s = load_settings(args, {"CAIRN_CHECKPOINT_SHARE_PAGES": "off"} if value is True else {})
    assert s.checkpoint_share_pages is (value if value is not None else True)   # the flag beats the variable


def test_model_that_is_a_file_but_no_model_says_so(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# not a model\n")
    r = subprocess.run([sys.executable, "-m", "cairn.daemon.cli.main", "serve", "--model", str(readme),
                        "--socket", str(tmp_path / "s.sock")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"{readme}: not a model directory or GGUF file" in r.stderr
    assert "does not exist" not in r.stderr and "Traceback" not in r.stderr


def _settings(tmp_path, sock):
    return load_settings({"model": str(tmp_path / "model"), "socket": str(sock)}, {})


def _never_loads(calls):
    def load(settings):
        calls.append(settings.model)
        raise ModelDirError("loaded")     # a stand-in for minutes of loading: the test needs only the call
    return load


def test_busy_socket_is_refused_before_the_model_loads(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    sock = d / "cairn.sock"
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(sock))
    other.listen(1)                       # another daemon answers there
    calls: list = []
    try:
        assert serve(_settings(tmp_path, sock), load_model=_never_loads(calls)) == 1
    finally:
        other.close()
    err = capsys.readouterr().err
    assert calls == []                    # the loader was never called
    assert f"{sock}: another server is already listening there" in err
    assert "another cairn daemon running" in err and "--socket PATH" in err


def test_a_file_at_the_socket_path_is_refused_before_the_model_loads(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    (d / "cairn.sock").write_text("")
    calls: list = []
    assert serve(_settings(tmp_path, d / "cairn.sock"), load_model=_never_loads(calls)) == 1
    err = capsys.readouterr().err
    assert calls == [] and "is not a socket" in err and "remove it" in err and "--socket PATH" in err


def test_a_stale_socket_is_no_reason_to_stop(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    sock = d / "cairn.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()                             # the file stays, nobody listens: a crashed run's leftover
    calls: list = []
    assert serve(_settings(tmp_path, sock), load_model=_never_loads(calls)) == 2
    assert calls == [str(tmp_path / "model")]


def test_unreachable_hint_names_a_command_that_starts_a_daemon():
    text = UNREACHABLE.format(path="/x.sock")
    assert "make serve" in text and "cairn serve --model" in text
