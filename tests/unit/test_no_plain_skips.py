"""No test skips or xfails except through tests/skip_policy.py's host_cannot() (issue 40 §7).

The run already fails on any skip (skip_policy.SkipsFail), but only when the skip happens: a skip behind
a host condition (no cgroup, no tool) passes on the machine that has it and turns a contributor's
`make test` red. So the source is checked too, by its syntax tree (comments and strings, such as the
suites test_skip_policy.py plants with pytester, do not count): a reference to pytest.skip,
importorskip, xfail, pytest.mark.skip/skipif/xfail or unittest's skips, under any import spelling, is
a finding. Only skip_policy.py itself may use them.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ALLOWED = {TESTS / "skip_policy.py"}

# dotted names (after resolving imports) that skip or xfail; an attribute below one counts too
# (pytest.skip.Exception, unittest.SkipTest subclasses spelt unittest.case.SkipTest, ...)
FORBIDDEN = ("pytest.skip", "pytest.importorskip", "pytest.xfail",
             "pytest.mark.skip", "pytest.mark.skipif", "pytest.mark.xfail",
             "_pytest.outcomes.skip", "_pytest.outcomes.importorskip", "_pytest.outcomes.xfail",
             "_pytest.outcomes.Skipped", "_pytest.outcomes.XFailed", "_pytest.skipping",
             "unittest.skip", "unittest.skipIf", "unittest.skipUnless", "unittest.SkipTest",
             "unittest.expectedFailure", "unittest.case.skip", "unittest.case.skipIf",
             "unittest.case.skipUnless", "unittest.case.SkipTest", "unittest.case.expectedFailure")


def _forbidden(dotted: str) -> bool:
    return any(dotted == f or dotted.startswith(f + ".") for f in FORBIDDEN)


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every import in the module."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                # `import a.b` binds a; `import a.b as c` binds c to a.b
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def plain_skips(source: str, filename: str = "<test>") -> list[str]:
    """'file:line: name' for each use of a skip or xfail outside the host-cannot policy."""
    tree = ast.parse(source, filename)
    aliases = _aliases(tree)
    inner = set()      # the value of an attribute chain: only the whole chain is judged
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, (ast.Attribute, ast.Name)) and id(node) not in inner:
            names = [_dotted(node, aliases)]
        else:
            continue
        found += [f"{filename}:{node.lineno}: {n}" for n in names if n is not None and _forbidden(n)]
    return sorted(set(found), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def test_no_test_module_skips_or_xfails_outside_the_policy():
    files = sorted(p for p in TESTS.rglob("*.py") if p not in ALLOWED)
    assert len(files) > 50                            # the scan sees the suite, not an empty folder
    found = [hit for p in files for hit in plain_skips(p.read_text(), str(p.relative_to(TESTS)))]
    assert found == [], ("tests skip or xfail outside tests/skip_policy.py; a host-dependent test calls "
                         "host_cannot(what it needs and how to get it), anything else must run:\n" + "\n".join(found))


BAD = '''
import pytest
import pytest as pt
from pytest import importorskip, mark
from pytest import mark as m
import unittest

torch = pytest.importorskip("torch")                    # 8
pytestmark = pytest.mark.skipif(True, reason="x")       # 9

@pt.mark.xfail(reason="later")                          # 11
def test_a():
    pt.skip("no cgroup")                                # 13

@mark.skip                                              # 15
def test_b(): importorskip("x")                         # 16

@m.skipif(1, reason="y")                                # 18
def test_c(request):
    request.applymarker(pytest.mark.xfail)              # 20
    raise unittest.SkipTest("z")                        # 21

def test_d():
    pytest.xfail("w")                                   # 24
    raise pytest.skip.Exception("v")                    # 25
'''

GOOD = '''
"""pytest.skip("in a docstring") does not count."""
import pytest
from skip_policy import host_cannot

# pytest.skip("in a comment") does not count
SUITE = "import pytest\\ndef test_s(): pytest.skip('planted')\\n"

@pytest.mark.parametrize("x", [1])
def test_a(x, pytester):
    skipped = [e for e in [] if e["event"] == "checkpoint_capture_skipped"]
    r = pytester.runpytest_inprocess()
    r.assert_outcomes(skipped=1)
    host_cannot("a memory cgroup")
'''


def test_the_scan_finds_every_spelling_of_a_skip_and_ignores_strings_and_comments(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text(BAD)
    lines = sorted({int(hit.split(":")[1]) for hit in plain_skips(bad.read_text(), bad.name)})
    assert lines == [4, 8, 9, 11, 13, 15, 16, 18, 20, 21, 24, 25]   # 4: `from pytest import importorskip`
    assert plain_skips(GOOD) == []


def test_the_scan_fails_the_check_on_a_planted_module(tmp_path, monkeypatch):
    """The suite-wide check, pointed at a folder holding one bad module, fails and names it."""
    (tmp_path / "test_planted.py").write_text("import pytest\ndef test_p():\n    pytest.skip('no GPU')\n")
    for i in range(60):
        (tmp_path / f"test_ok_{i}.py").write_text("def test_ok(): pass\n")
    monkeypatch.setattr(sys.modules[__name__], "TESTS", tmp_path)
    try:
        test_no_test_module_skips_or_xfails_outside_the_policy()
    except AssertionError as e:
        assert "test_planted.py:3: pytest.skip" in str(e)
    else:
        raise AssertionError("the check passed a module that calls pytest.skip")
