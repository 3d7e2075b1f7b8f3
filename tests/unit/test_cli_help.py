"""Every `cairn` subcommand's --help works (argparse %-formats help text: a stray % crashes it)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from cairn.daemon.cli.main import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path below parser, nested subparsers included (checkpoints ls, ...)."""
    out = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += _commands(child, path + (name,))
    return out


def test_the_walk_finds_the_nested_subcommands():
    found = set(_commands(build_parser()))
    for want in [(), ("serve",), ("make-model",), ("chat",), ("status",), ("checkpoints",),
                 ("checkpoints", "ls"), ("checkpoints", "rm")]:
        assert want in found


def test_every_subcommand_help_exits_0_with_usage():
    for path in _commands(build_parser()):
        r = subprocess.run([sys.executable, "-m", "cairn.daemon.cli.main", *path, "--help"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (path, r.stderr[-2000:])
        assert r.stdout.startswith("usage: cairn"), (path, r.stdout[:200])
        assert " ".join(("cairn",) + path) in r.stdout.splitlines()[0], path
        assert "Traceback" not in r.stderr, path
