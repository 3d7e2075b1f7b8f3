"""`make serve MODEL=...` (issue 42 §1): the Makefile hands any model path to `cairn serve --model`,
which serves a GGUF file and says what a directory lacks; only a path that does not exist is
refused by make itself, before any install.

make runs the real Makefile against a stand-in venv (VENV=...): its install stamp is current, its
`cairn` records its arguments and runs the real one, and its python fails loudly, so an install the
test did not expect cannot touch the real .venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL_CAIRN = Path(sys.executable).parent / "cairn"


@pytest.fixture()
def venv(tmp_path) -> Path:
    if shutil.which("make") is None:
        pytest.fail("make is not installed (the README's two commands need it)")
    v = tmp_path / "venv"
    (v / "bin").mkdir(parents=True)
    (v / "bin" / "python").write_text("#!/bin/sh\necho 'unexpected install' >&2\nexit 97\n")
    (v / "bin" / "cairn").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/args\nexec {REAL_CAIRN} "$@"\n')
    for f in ("python", "cairn"):
        (v / "bin" / f).chmod(0o755)
    later = time.time() + 86400            # newer than any source file, whatever another edit does
    for stamp in (".cairn-serving", ".cairn-installed"):
        (v / stamp).touch()
        os.utime(v / stamp, (later, later))
    return v


def _make_serve(venv: Path, model: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "serve", f"VENV={venv}", f"MODEL={model}",
                           f"ARGS=--socket {tmp_path}/run/s.sock"], capture_output=True, text=True, timeout=120)


def _args(tmp_path: Path) -> list[str] | None:
    f = tmp_path / "args"
    return f.read_text().split("\n")[:-1] if f.exists() else None


def test_a_gguf_file_goes_to_cairn_serve(venv, tmp_path):
    model = tmp_path / "x.gguf"
    model.write_bytes(b"GGUF" + bytes(60))     # not a valid one: cairn's reader says so, not make
    r = _make_serve(venv, model, tmp_path)
    assert "unexpected install" not in r.stderr
    assert _args(tmp_path) == ["serve", "--model", str(model), "--socket", f"{tmp_path}/run/s.sock"], r.stderr
    assert "no model directory" not in r.stdout + r.stderr


def test_a_directory_without_config_json_is_told_exactly_that(venv, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    r = _make_serve(venv, model, tmp_path)
    assert _args(tmp_path) is not None and r.returncode != 0
    assert f"{model}/config.json: missing (a model directory needs config.json)" in r.stderr


def test_a_path_that_does_not_exist_stops_before_any_install(venv, tmp_path):
    for stamp in (".cairn-serving", ".cairn-installed"):
        (venv / stamp).unlink()                # an install would be due: make must not get that far
    r = _make_serve(venv, tmp_path / "nope", tmp_path)
    assert r.returncode != 0 and _args(tmp_path) is None and "unexpected install" not in r.stderr
    assert f"MODEL={tmp_path}/nope: no such file or directory" in r.stdout + r.stderr
