"""Every Markdown link in README.md and docs/**/*.md resolves (issue 42 §5).

A relative link must name a file that exists; its `#anchor`, if any, must be a heading of that file
(or of the same file for a bare `#anchor`) under GitHub's slug rules: the heading's text without its
Markdown (code spans, emphasis, links keep their words), lower-cased, every character that is not a
letter, digit, mark, `_`, `-` or space dropped, spaces turned into `-`, and a repeated slug numbered
`-1`, `-2` in order. External links (http, https, mailto) are not fetched. Links inside fenced code
blocks and code spans are text, not links.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target); the target may be <...> and may carry a "title"
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
EXTERNAL = ("http://", "https://", "mailto:")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before duplicates are numbered)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)          # a link keeps its words
    text = re.sub(r"<[^>]+>", "", text)                              # inline HTML
    text = re.sub(r"(\*{1,3})(\S.*?\S|\S)\1", r"\2", text)            # emphasis
    text = re.sub(r"(?<!\w)(_{1,3})(\S.*?\S|\S)\1(?!\w)", r"\2", text)  # not inside a word
    kept = [c for c in text.lower()
            if c in " -_" or unicodedata.category(c)[0] in "LMN"]
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for _, line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in prose_lines(path.read_text()):
        bare = CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(bare)]
        m = REFERENCE_DEF.match(bare)
        if m:
            targets.append(m.group(1))
        out += [(n, t[1:-1] if t.startswith("<") else t) for t in targets]
    return out


def broken_links(files: list[Path]) -> list[str]:
    """One line per link that does not resolve: where it is, what it points at, what is wrong."""
    problems, cache = [], {}
    for path in files:
        for n, target in links(path):
            if target.startswith(EXTERNAL):
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else (path.parent / file_part).resolve()
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{n}: ({target})"
            if not dest.exists():
                problems.append(f"{where} no such file {dest}")
                continue
            if anchor:
                if dest.suffix != ".md" or not dest.is_file():
                    problems.append(f"{where} an anchor into {dest.name}, which has no headings")
                    continue
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    problems.append(f"{where} no heading of {dest.name} has the anchor #{anchor}")
    return problems


def test_every_link_in_readme_and_docs_resolves():
    files = doc_files()
    assert len(files) > 10, files
    assert sum(len(links(f)) for f in files) > 50       # the walk sees the docs' links at all
    problems = broken_links(files)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_slugs_follow_githubs_rules():
    assert slug("Memory: the plan, the limit, and the memory error") == "memory-the-plan-the-limit-and-the-memory-error"
    assert slug("For a gateway: `server_info`, `model_info`, `/v1/loads`") == "for-a-gateway-server_info-model_info-v1loads"
    assert slug("2026-12-03 evening, 2 vCPU AMD EPYC Zen 3, **AVX2 only**") == "2026-12-03-evening-2-vcpu-amd-epyc-zen-3-avx2-only"
    assert slug("The flash slice (layers 2–3) × 2") == "the-flash-slice-layers-23--2"
    assert slug("See [the API](api.md#x)") == "see-the-api"
    assert slug("For a gateway: /server_info, /model_info") == "for-a-gateway-server_info-model_info"
    assert slug("_Not_ *so* __plain__") == "not-so-plain"


def test_a_broken_file_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text(
        "# Title\n\n## Usage\n\n## Usage\n\n"
        "[ok](sub/b.md#the-part) [ok](#usage-1) [ok](https://example.invalid/none)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n"
        "[gone](sub/missing.md) [bad anchor](sub/b.md#no-such-part) [bad local](#usage-2)\n")
    (tmp_path / "sub" / "b.md").write_text("# B\n\n## The part\n\n[back](../a.md#title)\n")
    problems = broken_links([tmp_path / "a.md", tmp_path / "sub" / "b.md"])
    assert len(problems) == 3, problems
    assert "no such file" in problems[0] and "sub/missing.md" in problems[0]
    assert "#no-such-part" in problems[1] and "#usage-2" in problems[2]
