"""The README's and the user guides' (docs/*.md) Python snippets run, and run twice in a row
(as a newcomer would); their links stay inside the repository and resolve."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GUIDES = [README] + sorted((ROOT / "docs").glob("*.md"))
SNIPPETS = [(page, code) for page in GUIDES
            for code in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)]


@pytest.mark.parametrize("page,code", SNIPPETS,
                         ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(SNIPPETS)])
def test_snippet_runs_twice(page, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(textwrap.dedent(code), str(page), "exec"),  # noqa: S102
             {"__name__": "__readme__"})
    assert os.listdir(tmp_path)  # the snippets write files where they run


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        target = target.split("#")[0]
        assert (page.parent / target).resolve().is_relative_to(ROOT), target
        assert (page.parent / target).exists(), target
    assert "../shared" not in text and not re.search(r"\bissue \d+", text)


def test_the_readme_is_a_short_guide():
    """At most ~200 lines: what it is, the two commands, the quick start, the command line,
    links; the rest lives in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200
