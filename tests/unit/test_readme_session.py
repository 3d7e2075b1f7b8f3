"""The README's session can be replayed from a clone (issue 42 §1): every file it feeds a command
(`cmd < FILE`) ships in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_the_readme_session_reads_is_in_the_repository():
    text = (ROOT / "README.md").read_text()
    inputs = re.findall(r"^\$ .*?< (\S+)", text, re.M)
    assert "long_prompt.txt" in inputs
    for name in inputs:
        f = ROOT / name
        assert f.is_file() and f.stat().st_size > 0, f"README.md reads {name}, which the repository lacks"
